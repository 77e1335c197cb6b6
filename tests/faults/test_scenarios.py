"""Named fault scenarios on the real fault cluster, each judged by the history checker.

The classic GC pause (owner and its run stopped past a forced takeover), a dead owner whose host
agent is stopped (indeterminate: no grant until the agent answers), real PID reuse of a dead
owner's pid, and the etcd leader killed under fenced writes (no acknowledged write lost).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.localstack.simhost import SimulatedHost
from tests.faults.cluster import FaultCluster
from tests.faults.history import check
from tests.faults.workload import Launched, Soak, dump

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    c = FaultCluster(tmp_path_factory.mktemp("fault-cluster"), seed=7).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def soak(cluster: FaultCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Soak]:
    s = Soak(cluster, tmp_path, seed=7, sessions=1, name=request.node.name.removeprefix("test_")[:40])
    yield s
    s.kill_all()
    cluster.heal_all()


def _judge(soak: Soak) -> None:
    violations = check(soak.history())
    print("scenario figures:", dump(soak.figures(0, len(violations))))
    assert not violations, "\n".join(str(v) for v in violations)


def _run_pid(run: Launched) -> int:
    return run.host.outer_pid(run.proc)


def _owner_dies(soak: Soak, host: SimulatedHost, session: str) -> tuple[int, int]:
    """An owner on host, then kill -9 of its run and its child: (the child's pid in host, fence)."""
    run = soak.start_run(host, session, "plain")
    child, fence = soak.owner_child(session)
    host_pid = soak.host_pid_of(child)
    os.kill(_run_pid(run), signal.SIGKILL)
    os.kill(child, signal.SIGKILL)
    return host_pid, fence


def test_gc_pause_past_a_forced_takeover(soak: Soak, cluster: FaultCluster) -> None:
    session = soak.session_ids()[0]
    with soak.recording():
        first = soak.start_run(cluster.hosts[0], session, "plain")
        child, fence = soak.owner_child(session)
        for pid in (child, _run_pid(first)):
            cluster.pause(pid)
        forced = soak.start_run(cluster.hosts[1], session, "force")
        _, new_fence = soak.owner_child_above(session, fence)
        for pid in list(cluster.paused):
            cluster.resume(pid)
        time.sleep(1.0)  # the resumed owner tries to write with its old fence
        assert forced.proc.poll() is None, "the forced takeover's run should still own the session"
    assert new_fence > fence
    _judge(soak)


def test_a_stopped_agent_blocks_the_grant_until_it_answers(soak: Soak, cluster: FaultCluster) -> None:
    session = soak.session_ids()[0]
    with soak.recording():
        _, fence = _owner_dies(soak, cluster.hosts[0], session)
        agent = cluster.agent_pid(cluster.hosts[0])
        cluster.pause(agent)  # the dead owner's host cannot answer: its death is indeterminate
        refused = soak.start_run(cluster.hosts[1], session, "plain")
        assert refused.proc.wait(30) != 0
        assert soak.fences_started(session) == [fence], "granted while the owner's agent was stopped"
        cluster.resume(agent)
        soak.start_run(cluster.hosts[1], session, "wait")
        soak.owner_child_above(session, fence)
    _judge(soak)


def test_real_pid_reuse_of_a_dead_owner(soak: Soak, cluster: FaultCluster) -> None:
    session = soak.session_ids()[0]
    with soak.recording():
        host_pid, fence = _owner_dies(soak, cluster.hosts[2], session)
        soak.reuse_pid(cluster.hosts[2], host_pid)
        soak.start_run(cluster.hosts[0], session, "wait")
        soak.owner_child_above(session, fence)  # granted on the identity mismatch, not fooled by the pid
    _judge(soak)


def test_the_etcd_leader_killed_under_fenced_writes(soak: Soak, cluster: FaultCluster) -> None:
    session = soak.session_ids()[0]
    with soak.recording():
        soak.start_run(cluster.hosts[1], session, "plain")
        soak.owner_child(session)
        time.sleep(1.0)
        leader = cluster.leader()
        assert leader is not None
        process = cluster.etcd[leader].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        process.wait(5)
        time.sleep(3.0)
        cluster.restart_etcd(leader)
        time.sleep(1.0)
    assert len(soak._acks()) > 5
    _judge(soak)

