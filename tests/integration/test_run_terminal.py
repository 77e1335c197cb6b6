"""`holdfast run` at a terminal (issue 17): driven through a pseudo-terminal, CMD is the terminal's
foreground process group — what is typed reaches it, and Ctrl-C reaches CMD itself, not only `run`
— and `run` exits with CMD's status and releases the session. A real etcd, coordinator and agent;
`run` is started inside a simulated host through nsenter, as the session leader of the pty."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants, signals_as_at_a_terminal
from tests.integration.run_fixtures import Cluster, Run, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


class Terminal:
    """`holdfast run` with a pty for its stdin, stdout and stderr, as a shell at a terminal runs it."""

    def __init__(self, cluster: Cluster, host_id: str, session: str, script: str,
                 options: Sequence[str] = ()) -> None:
        host = cluster.host(host_id)
        self.master, slave = os.openpty()
        # `setsid --ctty`: a new session whose controlling terminal is the pty on its stdin, as a
        # terminal's login shell has; SIGINT and SIGQUIT at their defaults, or Ctrl-C reaches nothing.
        argv = ["setsid", "--ctty", sys.executable, "-m", "holdfast.cli", "run", "--session", session,
                *options, "--", "sh", "-c", script]
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


def live_record(cluster: Cluster, sid: str) -> pb.SessionRecord | None:
    listed = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10).records
    return next((r for r in listed if r.session_id == sid and r.lease.claim_status == pb.LIVE), None)


def test_ctrl_c_before_cmd_ran_is_one_line_130_and_the_report_says_why(cluster: Cluster) -> None:
    """Ctrl-C while `run --wait` waits for a held session: one line, not a traceback; 130; the
    report written, saying CMD never ran and why; the holder undisturbed."""
    sid = "sess-pty-wait-01"
    holder = cluster.run(cluster.host("host-pty-hold"), sid, cmd=["sleep", "60"])
    held = until("the holder live", lambda: live_record(cluster, sid))
    report = cluster.tmp / "report.json"
    term = Terminal(cluster, "host-pty-c", sid, "echo ran", ["--wait", "30", "--report", str(report)])
    try:
        # Its gate spawned: `run` is inside the command, asking or waiting, when Ctrl-C comes.
        until("run's gate", lambda: descendants(term.run_pid))
        term.type(b"\x03")  # Ctrl-C: SIGINT to `run`, the terminal's foreground group until CMD runs
        term.expect(rb"INTERRUPTED[^\n]*\n")
        assert term.proc.wait(30) == 130, term.seen
    finally:
        term.close()
    # "^C" is the terminal's echo of the keystroke.
    said = [line.removeprefix("^C") for line in term.seen.decode().splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("holdfast: INTERRUPTED: interrupted"), said
    assert json.loads(report.read_text()) | {"message": "", "next_step": ""} == {
        "schema": "holdfast/v1", "ran": False, "exit_code": 130, "cmd_status": None, "reason": "INTERRUPTED",
        "message": "", "next_step": "", "session": sid, "fence": 0}
    assert cluster.record(sid).record == held and holder.proc.poll() is None


# A library caller cancelled between the gate's release and supervise's first wait, as a Ctrl-C
# there is delivered (before supervise forwards signals to CMD).
CANCELLED_BEFORE_SUPERVISE = """
import asyncio, sys
from holdfast.client.acquire import RunSpec
from holdfast.client.connection import Client
from holdfast.client.owner import Owner

async def main() -> None:
    async with Client() as client:
        owner = await Owner.start(client, RunSpec(session_id=sys.argv[1], argv=["sleep", "60"], grace=5))
        asyncio.current_task().cancel()
        try:
            await owner.supervise()
        except asyncio.CancelledError:
            print("cancelled", flush=True)

asyncio.run(main())
"""


def test_a_cancel_before_supervise_forwards_signals_ends_the_tree_and_releases(cluster: Cluster) -> None:
    sid = "sess-cancel-01"
    host = cluster.host("host-cancel")
    proc = host.spawn([sys.executable, "-c", CANCELLED_BEFORE_SUPERVISE, sid], env=cluster.env(host),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"cancelled\n"), err
    assert b"interrupted; ending the tree" in err
    record = cluster.record(sid).record
    assert (record.lease.claim_status, record.lease.fence) == (pb.RELEASED, 1)
