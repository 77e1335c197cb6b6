"""Fixtures for `holdfast run` tests: a real etcd and coordinator, simulated hosts whose agents
register themselves, and `holdfast run` processes started inside those hosts.

Addresses are 127.0.0.N with N in 100..149. Everything a fixture starts, it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from holdfast.coordinator.store import Put, Store
from holdfast.localstack.simhost import SimulatedHost, wait_for
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration import unprivileged
from tests.integration.conftest import descendants
from tests.integration.coordinator_fixtures import Coordinator

CHILD = str(Path(__file__).with_name("run_child.py"))
_indexes = itertools.cycle(range(100, 150))


def until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> object:
    return wait_for(what, probe, timeout)


@dataclass
class Run:
    """One `holdfast run` inside a simulated host; `proc` is the outer nsenter waiting on it."""

    host: SimulatedHost
    proc: subprocess.Popen[bytes]
    stderr: Path

    @property
    def run_pid(self) -> int:
        """The machine-namespace pid of the `holdfast run` process itself."""
        return self.host.outer_pid(self.proc)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def err(self) -> str:
        return self.stderr.read_text() if self.stderr.exists() else ""


@dataclass
class Cluster:
    coordinator: Coordinator
    tmp: Path
    hosts: dict[str, SimulatedHost] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    shared: list[Path] = field(default_factory=list)  # world-writable directories made for runs

    @property
    def stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        return coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(self.coordinator.address))

    def host(self, host_id: str, *agent_args: str) -> SimulatedHost:
        host = SimulatedHost(host_id, next(_indexes), self.tmp / host_id,
                             agent_args=["--coordinator", self.coordinator.address, *agent_args])
        self.hosts[host_id] = host
        host.start()
        until(f"registration of {host_id}", lambda: any(
            h.host_id == host_id for h in self.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts))
        return host

    def env(self, host: SimulatedHost) -> dict[str, str]:
        # TMPDIR: a run killed -9 leaves its grant directory behind; it stays in the test's tmp.
        # XDG_STATE_HOME: a takeover keeps its operation id there per host and session; under the
        # shared ~/.local/state, a copy of the suite running beside this one (same host and
        # session names) deleted or replaced it, and a retried takeover was OPERATION_CONFLICT.
        return {**os.environ, "HOLDFAST_HOST_ID": host.host_id, "TMPDIR": str(self.tmp),
                "XDG_STATE_HOME": str(self.tmp / "state"),
                "HOLDFAST_COORDINATOR": self.coordinator.address, "HOLDFAST_RUN_CHILD": CHILD}

    def run(self, host: SimulatedHost, session: str, *options: str, cmd: list[str] | None = None,
            as_nobody: bool = False, env: dict[str, str] | None = None, cwd: Path | None = None,
            drop: Sequence[str] = unprivileged.DROP, command: str = "run", wrap: Sequence[str] = ()) -> Run:
        """`holdfast run --session S OPTIONS -- CMD` on `host` (CMD defaults to the overlap child),
        as root or, with `as_nobody`, as an unprivileged user: with no capabilities, or as `drop`
        (a setpriv to nobody) leaves it; `command` another that takes run's options (`codex`);
        `wrap` a command that execs the rest (an `unshare -m` that mounts first)."""
        cmd = cmd or self.child()
        stderr = self.tmp / f"run-{len(self.runs)}.err"
        python, run_env = sys.executable, {**self.env(host), **(env or {})}
        prefix: list[str] = []
        if as_nobody:
            python, extra = unprivileged.interpreter()
            home = unprivileged.shared_dir("holdfast-nobody-home-")
            os.chmod(home, 0o1777)  # its TMPDIR unless given: one others may write must be sticky (grantdir)
            self.shared.append(home)
            run_env.update(extra, HOME=str(home), TMPDIR=(env or {}).get("TMPDIR", str(home)),
                           XDG_STATE_HOME=str(home))
            prefix = list(drop)
        argv = [*wrap, *prefix, python, "-m", "holdfast.cli", command, "--session", session, *options,
                "--", *cmd]
        with open(stderr, "wb") as err:
            proc = host.spawn(argv, env=run_env, stdout=subprocess.DEVNULL, stderr=err, cwd=str(cwd or "/"))
        run = Run(host, proc, stderr)
        self.runs.append(run)
        return run

    def child(self, *extra: str) -> list[str]:
        return [sys.executable, CHILD, str(self.tmp / "session.lock"), str(self.tmp / "session.log"), *extra]

    def log(self) -> list[list[str]]:
        path = self.tmp / "session.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def events(self, name: str) -> list[list[str]]:
        return [e for e in self.log() if e[0] == name]

    def etcd_put(self, key: str, value: bytes) -> None:
        """Writes `key` (below the coordinator's prefix) straight into etcd, past every check."""
        async def put() -> None:
            store = Store.connect(self.coordinator.etcd_url, prefix=self.coordinator.prefix)
            try:
                assert (await store.txn([], [Put(store.key(key), value)]))[0]
            finally:
                await store.close()

        asyncio.run(put())

    def record(self, session: str) -> pb.GetSessionResponse:
        return self.stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=10)

    def stop(self) -> None:
        for run in self.runs:
            if run.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, TimeoutError):
                    os.kill(run.run_pid, signal.SIGCONT)
                    os.kill(run.proc.pid, signal.SIGCONT)
                for pid in [*descendants(run.proc.pid), run.proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                run.proc.wait(10)
        for host in self.hosts.values():
            host.stop()
        for path in self.shared:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(coordinator: Coordinator, tmp_path: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("session tests run as root: simulated hosts are PID namespaces (CI runs as root)")
    c = Cluster(coordinator, tmp_path)
    try:
        yield c
    finally:
        c.stop()
