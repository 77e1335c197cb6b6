"""A process whose memory cannot be read — every reader of its environ waits forever behind a FUSE
read its own thread started (tests/integration/stuck_fuse.py) — stops nothing of the agent but the
answers that need that environ: the agent keeps its registration, another session on the host is
attested, probed and proven gone, and whatever needs the stuck environ answers unproven (never
death), parking one thread for that process however often it is asked (docs/guarantees.md). The
agent reads every process on its host, so each stuck process there parks a thread of its own —
another user's, here, or another test's beside this one (the suite runs on two workers): what is
counted is per process. `agent doctor` answers beside it too."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import agent_pb2, coordinator_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import AgentProcess, attest, mint_token, probe
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.stuck_fuse import CHILD, StuckFuse

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root]
P = agent_pb2.ProbeOutcome
VAR = "HOLDFAST_SPAWN_TOKEN"
HOST = "host-stuck"
STUCK_LOG = "a read of another process's memory is stuck"
RETURNED_LOG = "a read given up as stuck returned"


def registered(coordinator: Coordinator) -> list[pb.HostRegistration]:
    stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
    return [h for h in stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts if h.host_id == HOST]


def lease_ttl(etcd_url: str, lease_id: int) -> int:
    """Seconds left on the lease, from etcd itself (its JSON gateway)."""
    body = json.dumps({"ID": lease_id}).encode()
    request = urllib.request.Request(f"{etcd_url}/v3/lease/timetolive", data=body)
    with urllib.request.urlopen(request, timeout=5) as reply:
        return int(json.load(reply)["TTL"])


def until(what: str, cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def reading(agent_pid: int, pid: int) -> int:
    """The agent's threads in a read of `pid`'s environ, as the kernel says (each thread's system
    call, read being 0 on x86-64, and the file its descriptor names): the reads waiting on that
    process. Counted per process, since the agent's stuck reads of other processes on the host are
    none of this test's. A thread or descriptor gone between the listing and its read is not one."""
    environ = f"/proc/{pid}/environ"
    count = 0
    for tid in os.listdir(f"/proc/{agent_pid}/task"):
        try:
            call = Path(f"/proc/{agent_pid}/task/{tid}/syscall").read_text().split()
            if call[0] == "0" and os.readlink(f"/proc/{agent_pid}/fd/{int(call[1], 16)}") == environ:
                count += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
    return count


def logged(agent: AgentProcess, what: str) -> collections.Counter[int]:
    """The agent's log lines (whole ones: the last may be half written) saying `what`, by the pid
    each names."""
    counts: collections.Counter[int] = collections.Counter()
    for line in agent.log_path.read_text().split("\n")[:-1]:
        if line.startswith("{") and (entry := json.loads(line))["msg"].startswith(what):
            counts[entry["pid"]] += 1
    return counts


def parked_by_log(agent: AgentProcess) -> collections.Counter[int]:
    """The agent's parked reads by pid, as its log says: each given up as stuck, less each returned."""
    counts = logged(agent, STUCK_LOG)
    counts.subtract(logged(agent, RETURNED_LOG))
    return +counts


def gauge_agrees(metrics: str, agent: AgentProcess) -> bool:
    """Whether the gauge of parked reads counts those the log names, on every process of the host."""
    return parked(metrics) == sum(parked_by_log(agent).values())


def parked(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith("holdfast_agent_reads_parked ")))


def spawn(children: list, argv: list[str], token: str,  # type: ignore[type-arg]
          **kw: object) -> subprocess.Popen:  # type: ignore[type-arg]
    p = subprocess.Popen(argv, env={"PATH": os.environ["PATH"], VAR: token}, **kw)  # type: ignore[call-overload]
    children.append(p)
    return p


def in_mmap(pid: int) -> bool:
    """Whether the process's main thread waits in mmap (syscall 9 on x86-64: this machine's)."""
    return Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()[0] == "9"


def unreadable(fuse: StuckFuse, start: Callable[[list[str], tuple[int, int]], subprocess.Popen],  # type: ignore[type-arg]
               python: str = sys.executable,
               pid_of: Callable[[subprocess.Popen], int] = lambda p: p.pid,  # type: ignore[type-arg]
               ) -> subprocess.Popen:  # type: ignore[type-arg]
    """A process whose memory nobody can read, once this returns: `start` starts it (its argv and the
    descriptors to pass it), `pid_of` is its pid in this namespace. Its own read of `fuse`'s file
    waits on the daemon, and its mmap, queued behind that read, holds every later reader."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    p = start([python, "-c", CHILD, str(fuse.file), str(ready_w), str(go_r)], (ready_w, go_r))
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"m"
        assert fuse.read_asked.wait(10), "the process's own read never reached the daemon"
        os.write(go_w, b"g")
        until("the process queued for its mmap lock", lambda: in_mmap(pid_of(p)))
    finally:
        os.close(ready_r)
        os.close(go_w)
    return p


def test_a_stuck_environ_leaves_the_agent_answering(coordinator: Coordinator, etcd, tmp_path: Path,
                                                    children: list) -> None:
    agent = AgentProcess(tmp_path, HOST, args=["--coordinator", coordinator.address,
                                               "--metrics-listen", "127.0.0.1:0"])
    metrics = json.loads((tmp_path / f"ready-{HOST}.json").read_text())["metrics"]
    mountpoints = tmp_path / "fuse", tmp_path / "other-fuse"
    for mountpoint in mountpoints:
        mountpoint.mkdir()
    try:
        until("the agent's registration", lambda: len(registered(coordinator)) == 1)
        lease = registered(coordinator)[0].lease_id
        with StuckFuse(mountpoints[0]) as fuse, StuckFuse(mountpoints[1]) as other_fuse:
            # Another user's process nobody can read, there before the session: read by a scan of
            # the whole host (the attestation's below), it parks a thread of its own.
            other_token = mint_token()
            other = unreadable(other_fuse, lambda argv, fds: spawn(children, argv, other_token, pass_fds=fds))
            # Session A: its root, attested, then a process of its time whose memory nobody can read.
            token_a = mint_token()
            root_a = spawn(children, ["sleep", "300"], token_a)
            identity_a = attest(agent.stub, token_a, pid_hint=root_a.pid)
            hostile = unreadable(fuse, lambda argv, fds: spawn(children, argv, token_a, pass_fds=fds))

            root_a.kill()
            root_a.wait()
            gone_a = probe(agent.stub, identity_a, check_tree=True)
            assert gone_a.outcome == P.PID_ABSENT
            assert gone_a.tree_checked and not gone_a.tree_gone, gone_a
            assert "could not be read" in gone_a.tree_reason
            assert logged(agent, STUCK_LOG)[hostile.pid] == 1 and reading(agent.proc.pid, hostile.pid) == 1
            until("the gauge to count the parked reads", lambda: gauge_agrees(metrics, agent))
            # The agent's registration is renewed while the read stays stuck: its lease's time left
            # goes up again.
            lowest = [lease_ttl(etcd.url, lease)]

            def renewed() -> bool:
                left = lease_ttl(etcd.url, lease)
                lowest[0] = min(lowest[0], left)
                return left > lowest[0]

            until("a heartbeat", renewed)

            # Asked again and again, at once: the same answer, and no other thread parked.
            with ThreadPoolExecutor(5) as pool:
                answers = list(pool.map(lambda _: probe(agent.stub, identity_a, check_tree=True), range(5)))
            for again in answers:
                assert again.tree_checked and not again.tree_gone and "could not be read" in again.tree_reason
            ticks = int(Path(f"/proc/{hostile.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
            alive = probe(agent.stub, agent_pb2.ProcessIdentity(
                host_id=HOST, incarnation=identity_a.incarnation, pid=hostile.pid, start_ticks=ticks,
                spawn_token=token_a, spawn_token_env=VAR))
            assert alive.outcome == P.IDENTITY_MATCHED and "token" not in alive.matched_on  # its pid and age
            with pytest.raises(grpc.RpcError) as refused:
                attest(agent.stub, token_a, pid_hint=hostile.pid)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # One thread parked on each stuck process, however often it was read: the refused
            # attestation's scan of the whole host read the other one.
            for pid in (hostile.pid, other.pid):
                assert logged(agent, STUCK_LOG)[pid] == 1 and reading(agent.proc.pid, pid) == 1, pid
            until("the gauge to count the parked reads", lambda: gauge_agrees(metrics, agent))
            # `agent doctor` answers too, naming it unreadable (at most three are named).
            doctor = subprocess.run([sys.executable, "-m", "holdfast.cli", "agent", "doctor", "--json"],
                                    capture_output=True, text=True, timeout=60)
            environ = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}["environ-readable"]
            assert environ["status"] == "fail", environ
            assert f"pid {hostile.pid} (python" in environ["detail"] or " more)" in environ["detail"], environ

            # Session B, started after it, is attested, probed and proven gone as ever.
            token_b = mint_token()
            root_b = spawn(children, ["sleep", "300"], token_b)
            identity_b = attest(agent.stub, token_b, pid_hint=root_b.pid)
            assert probe(agent.stub, identity_b).outcome == P.IDENTITY_MATCHED
            root_b.kill()
            root_b.wait()
            gone_b = probe(agent.stub, identity_b, check_tree=True)
            assert gone_b.outcome == P.PID_ABSENT and gone_b.tree_gone, gone_b
            assert [h.lease_id for h in registered(coordinator)] == [lease]  # never lapsed
        # The connections aborted: the stuck reads returned, their threads ended, none is parked.
        hostile.wait(10)
        other.wait(10)
        until("the parked reads to return", lambda: not parked_by_log(agent)[hostile.pid]
              and not parked_by_log(agent)[other.pid])
        assert reading(agent.proc.pid, hostile.pid) == reading(agent.proc.pid, other.pid) == 0
        until("the gauge to count the parked reads", lambda: gauge_agrees(metrics, agent))
    finally:
        agent.stop()
