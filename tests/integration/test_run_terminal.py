"""`holdfast run` at a terminal (issue 17): driven through a pseudo-terminal, CMD is the terminal's
foreground process group — what is typed reaches it, and Ctrl-C reaches CMD itself, not only `run`
— and `run` exits with CMD's status and releases the session. A real etcd, coordinator and agent;
`run` is started inside a simulated host through nsenter, as the session leader of the pty."""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import time

import pytest

from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants, signals_as_at_a_terminal
from tests.integration.run_fixtures import Cluster, Run

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


class Terminal:
    """`holdfast run` with a pty for its stdin, stdout and stderr, as a shell at a terminal runs it."""

    def __init__(self, cluster: Cluster, host_id: str, session: str, script: str) -> None:
        host = cluster.host(host_id)
        self.master, slave = os.openpty()
        # `setsid --ctty`: a new session whose controlling terminal is the pty on its stdin, as a
        # terminal's login shell has; SIGINT and SIGQUIT at their defaults, or Ctrl-C reaches nothing.
        argv = ["setsid", "--ctty", sys.executable, "-m", "holdfast.cli", "run", "--session", session, "--",
                "sh", "-c", script]
        with signals_as_at_a_terminal():
            self.proc = host.spawn(argv, env=cluster.env(host), stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        cluster.runs.append(Run(host, self.proc, cluster.tmp / "pty.none"))  # the fixture stops it
        self.run_pid = host.outer_pid(self.proc)
        self.seen = b""

    def expect(self, pattern: bytes, timeout: float = 30.0) -> re.Match[bytes]:
        """Reads the terminal until `pattern` appears in everything shown so far."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.seen)):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise TimeoutError(f"no {pattern!r} on the terminal; it shows {self.seen!r}")
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every slave end closed
                chunk = b""
            if not chunk:
                raise EOFError(f"the terminal closed without {pattern!r}; it showed {self.seen!r}")
            self.seen += chunk
        return found

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def foreground(self) -> int:
        return os.tcgetpgrp(self.master)  # the slave's foreground group, as this namespace numbers it

    def wait(self, timeout: float = 30.0) -> int:
        with contextlib.suppress(TimeoutError, EOFError):
            self.expect(rb"released at fence", timeout)  # drain the output so `run` never blocks on it
        return self.proc.wait(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.master)


def assert_cmd_is_in_the_foreground(term: Terminal) -> None:
    fg = term.foreground()
    assert fg != os.getpgid(term.run_pid), "run kept the terminal: CMD would get SIGTTIN and no Ctrl-C"
    assert fg in descendants(term.run_pid), (fg, descendants(term.run_pid))


def test_typed_input_reaches_cmd_in_the_foreground_group(cluster: Cluster) -> None:
    sid = "sess-pty-read-01"
    term = Terminal(cluster, "host-pty-a", sid, 'echo ready; read x; echo "got $x"')
    try:
        term.expect(rb"ready")
        assert_cmd_is_in_the_foreground(term)
        term.type(b"hello\n")
        term.expect(rb"got hello")
        assert term.wait() == 0, term.seen
    finally:
        term.close()
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED


@pytest.mark.parametrize("script,status", [
    # CMD traps SIGINT and exits with its own status: Ctrl-C reached CMD, and run reports it.
    ("trap 'echo caught-int; exit 7' INT; echo ready; read x; echo not-interrupted", 7),
    # CMD does not: it dies of SIGINT, and run exits as a shell reports that (128 + 2).
    ("echo ready; read x; echo not-interrupted", 130),
])
def test_ctrl_c_reaches_cmd_and_run_exits_with_its_status(cluster: Cluster, script: str, status: int) -> None:
    sid = f"sess-pty-intr-{status}"
    term = Terminal(cluster, "host-pty-b", sid, script)
    try:
        term.expect(rb"ready")
        assert_cmd_is_in_the_foreground(term)
        term.type(b"\x03")  # Ctrl-C: the line discipline sends SIGINT to the foreground group
        if status == 7:
            term.expect(rb"caught-int")
        assert term.wait() == status, term.seen
        assert b"not-interrupted" not in term.seen
    finally:
        term.close()
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED
