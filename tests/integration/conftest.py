"""Fixtures for real agents: one in this machine's PID namespace, and simulated hosts in their own.

Each fixture stops everything it started. Addresses are 127.0.0.N with N in 10..49 for agent tests.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import agent_pb2, agent_pb2_grpc

_indexes = itertools.cycle(range(10, 50))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test of a module using stuck_fuse.StuckFuse is marked `stalls_reads`: while it runs, a
    process's memory nobody can read exists on this machine, so every agent of every other test
    running beside it (one in this PID namespace reads all of /proc) meets it, parks a reader on it
    and proves nothing its scan would cross. scripts/test runs those tests alone, after the rest."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "StuckFuse"):
            item.add_marker(pytest.mark.stalls_reads)


def mint_token() -> str:
    return secrets.token_hex(16)


@contextlib.contextmanager
def signals_as_at_a_terminal() -> Iterator[None]:
    """Children started inside get SIGINT and SIGQUIT at their defaults, as a terminal's shell starts
    a job. A suite started in the background of a non-interactive shell has them ignored, and an
    ignored signal stays ignored across fork and exec. Set in this process around the spawn, never
    in a preexec_fn: Python code between fork and exec runs grpc's fork handlers in a child of a
    process with channels open, and one such child aborted (epoll_wait: Bad file descriptor)."""
    saved = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
             signal.SIGQUIT: signal.signal(signal.SIGQUIT, signal.SIG_DFL)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class AgentProcess:
    """A real `holdfast agent serve` child with a client stub on its channel."""

    def __init__(self, tmp: Path, host_id: str, prefix: Sequence[str] = (),
                 env_var: str = "HOLDFAST_SPAWN_TOKEN", args: Sequence[str] = (),
                 stop_signal: int = signal.SIGTERM) -> None:
        self.stop_signal = stop_signal
        ready = tmp / f"ready-{host_id}.json"
        ready.unlink(missing_ok=True)  # an earlier agent of the same host id left its own behind
        self.log_path = tmp / f"agent-{host_id}.log"
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "holdfast.cli", "agent", "serve",
             "--listen", f"127.0.0.{next(_indexes)}:0", "--host-id", host_id,
             "--spawn-token-env", env_var, "--ready-file", str(ready), *args],
            stderr=open(self.log_path, "ab"),  # noqa: SIM115 - the child owns it
        )
        deadline = time.monotonic() + 15
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"agent did not start: {self.log_path.read_text()}")
            time.sleep(0.01)
        announced = json.loads(ready.read_text())
        self.address, self.health = announced["address"], announced.get("health", "")
        self.channel = grpc.insecure_channel(self.address)
        self.stub = agent_pb2_grpc.HostAgentStub(self.channel)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if hasattr(self, "channel"):
            self.channel.close()


def stub_for(address: str) -> agent_pb2_grpc.HostAgentStub:
    return agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(address))


def probe(stub: agent_pb2_grpc.HostAgentStub, identity: agent_pb2.ProcessIdentity,
          check_tree: bool = False) -> agent_pb2.ProbeResult:
    req = agent_pb2.ProbeOwnersRequest(owners=[identity], check_tree=check_tree)
    return stub.ProbeOwners(req, timeout=10).results[0]


def attest(stub: agent_pb2_grpc.HostAgentStub, token: str, pid_hint: int = 0) -> agent_pb2.ProcessIdentity:
    req = agent_pb2.AttestSpawnRequest(spawn_token=token, pid_hint=pid_hint)
    return stub.AttestSpawn(req, timeout=10).identity


def wait_carrier(stub: agent_pb2_grpc.HostAgentStub, token: str, want: int = 1,
                 timeout: float = 5.0) -> agent_pb2.ScanResult:
    """The agent's own scan, until it sees `want` carriers of the token (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while True:
        scan = stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
        if len(scan.carriers) >= want or time.monotonic() > deadline:
            return scan
        time.sleep(0.01)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    if os.geteuid() != 0:
        pytest.fail("agent integration tests run as root (CI runs as root)")
    a = AgentProcess(tmp_path, "host-local")
    yield a
    a.stop()


@pytest.fixture
def simhosts(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    """Factory: simhosts("h1") → a started SimulatedHost; all are stopped at teardown."""
    started: list[SimulatedHost] = []

    def make(host_id: str) -> SimulatedHost:
        host = SimulatedHost(host_id, next(_indexes), tmp_path / host_id)
        started.append(host)
        host.start()
        return host

    yield make
    for host in started:
        host.stop()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:  # type: ignore[type-arg]
    """Processes a test starts; killed and reaped at teardown."""
    procs: list[subprocess.Popen] = []  # type: ignore[type-arg]
    yield procs
    for p in procs:
        for pid in [*descendants(p.pid), p.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait(5)


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (this namespace's view), deepest last."""
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [d for k in kids for d in (k, *descendants(k))]


def wait_empty(path: Path, timeout: float = 10.0) -> None:
    """Until cgroup.events says `populated 0`: the kernel notifies a change with POLLPRI."""
    deadline = time.monotonic() + timeout
    with open(path / "cgroup.events", "rb", buffering=0) as events:
        poller = select.poll()
        poller.register(events, select.POLLPRI)
        while b"populated 0" not in (events.seek(0) == 0 and events.read()):
            left = deadline - time.monotonic()
            assert left > 0, f"{path} still populated"
            poller.poll(left * 1000)
