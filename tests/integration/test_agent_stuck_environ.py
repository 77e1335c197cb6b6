"""A process whose memory cannot be read — every reader of its environ waits forever behind a FUSE
read its own thread started (tests/integration/stuck_fuse.py) — stops nothing of the agent but the
answers that need that environ: the agent keeps its registration, another session on the host is
attested, probed and proven gone, and whatever needs the stuck environ answers unproven (never
death), parking one thread however often it is asked (docs/guarantees.md). `agent doctor` answers
beside it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
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


def waiting(pid: int) -> int:
    """The process's threads waiting in the kernel uninterruptibly (state D): its stuck reads. A
    thread that ends between the listing and its read (the agent's other workers come and go) is
    not waiting."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            states.append(Path(f"/proc/{pid}/task/{tid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return states.count(b"D")


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


def test_a_stuck_environ_leaves_the_agent_answering(coordinator: Coordinator, etcd, tmp_path: Path,
                                                    children: list) -> None:
    agent = AgentProcess(tmp_path, HOST, args=["--coordinator", coordinator.address,
                                               "--metrics-listen", "127.0.0.1:0"])
    metrics = json.loads((tmp_path / f"ready-{HOST}.json").read_text())["metrics"]
    mountpoint = tmp_path / "fuse"
    mountpoint.mkdir()
    try:
        until("the agent's registration", lambda: len(registered(coordinator)) == 1)
        lease = registered(coordinator)[0].lease_id
        with StuckFuse(mountpoint) as fuse:
            # Session A: its root, attested, then a process of its time whose memory nobody can read.
            token_a = mint_token()
            root_a = spawn(children, ["sleep", "300"], token_a)
            identity_a = attest(agent.stub, token_a, pid_hint=root_a.pid)
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            hostile = spawn(children, [sys.executable, "-c", CHILD, str(fuse.file), str(ready_w), str(go_r)],
                            token_a, pass_fds=(ready_w, go_r))
            os.close(ready_w)
            os.close(go_r)
            assert os.read(ready_r, 1) == b"m"
            assert fuse.read_asked.wait(10), "the hostile process's own read never reached the daemon"
            os.write(go_w, b"g")
            until("the hostile process queued for its mmap lock", lambda: in_mmap(hostile.pid))

            root_a.kill()
            root_a.wait()
            gone_a = probe(agent.stub, identity_a, check_tree=True)
            assert gone_a.outcome == P.PID_ABSENT
            assert gone_a.tree_checked and not gone_a.tree_gone, gone_a
            assert "could not be read" in gone_a.tree_reason
            assert parked(metrics) == 1 and waiting(agent.proc.pid) == 1
            # The agent's registration is renewed while the read stays stuck: its lease's time left
            # goes up again.
            lowest = [lease_ttl(etcd.url, lease)]

            def renewed() -> bool:
                left = lease_ttl(etcd.url, lease)
                lowest[0] = min(lowest[0], left)
                return left > lowest[0]

            until("a heartbeat", renewed)

            # Asked again and again: the same answer, and no other thread parked.
            for _ in range(5):
                again = probe(agent.stub, identity_a, check_tree=True)
                assert again.tree_checked and not again.tree_gone and "could not be read" in again.tree_reason
            ticks = int(Path(f"/proc/{hostile.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
            alive = probe(agent.stub, agent_pb2.ProcessIdentity(
                host_id=HOST, incarnation=identity_a.incarnation, pid=hostile.pid, start_ticks=ticks,
                spawn_token=token_a, spawn_token_env=VAR))
            assert alive.outcome == P.IDENTITY_MATCHED and "token" not in alive.matched_on  # its pid and age
            with pytest.raises(grpc.RpcError) as refused:
                attest(agent.stub, token_a, pid_hint=hostile.pid)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert parked(metrics) == 1 and waiting(agent.proc.pid) == 1
            assert agent.log_path.read_text().count(STUCK_LOG) == 1
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
        # The connection aborted: the stuck read returned, its thread ended, nothing is parked.
        hostile.wait(10)
        until("the parked read to return", lambda: parked(metrics) == 0)
    finally:
        agent.stop()
