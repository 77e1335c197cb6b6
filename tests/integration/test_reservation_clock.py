"""A reservation that a skewed clock cannot hold: one coordinator replica runs 3 h ahead, or 3 h
behind (libfaketime, its monotonic clock left true), beside one on this machine's clock, over one
real etcd, with a real agent on host-a. A reservation's deadline is the wall-clock time of the
replica that granted it; each replica also times it on its own monotonic clock and, after half its
window, asks the reserved host's agent: no process carrying the reserved token supersedes it
(evidence reservation-unused); a carrier (a gate about to commit) keeps it, and nothing is written.
"""

from __future__ import annotations

import glob
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.run_fixtures import until

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="the agent reads other processes' environments")]
WINDOW = ("--commit-window-seconds", "4")
FAKETIME = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")


def skewed(offset: str) -> dict[str, str]:
    assert FAKETIME, "libfaketime is missing: ./scripts/setup installs Debian's faketime"
    return {"LD_PRELOAD": FAKETIME[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.fixture
def replicas(etcd, tmp_path: Path, prefix: str, request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
             ) -> Iterator[tuple[coordinator_pb2_grpc.CoordinatorStub, coordinator_pb2_grpc.CoordinatorStub]]:
    """(this machine's clock, the skewed one), and host-a's agent registered."""
    started = []
    for name, env in (("true", {}), ("skewed", skewed(request.param))):
        (tmp_path / name).mkdir()
        started.append(Coordinator(etcd.url, tmp_path / name, prefix, args=WINDOW, env=env).start())
    agent = AgentProcess(tmp_path, "host-a", args=["--coordinator", started[0].address])
    stubs = [coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(c.address)) for c in started]
    try:
        until("host-a registered", lambda: any(
            h.host_id == "host-a" for h in stubs[0].ListHosts(pb.ListHostsRequest(), timeout=5).hosts))
        yield stubs[0], stubs[1]
    finally:
        agent.stop()
        for c in started:
            c.stop()


def acquire(stub: coordinator_pb2_grpc.CoordinatorStub, sid: str, wait: float = 0) -> pb.AcquireResponse:
    return stub.Acquire(pb.AcquireRequest(session_id=sid, operation_id=os.urandom(16).hex(), host_id="host-a",
                                          wait_seconds=wait), timeout=wait + 30)


@pytest.mark.parametrize("replicas", ["+3h"], indirect=True)
def test_a_reservation_by_a_replica_hours_ahead_is_superseded_once_proven_unused(replicas) -> None:  # type: ignore[no-untyped-def]
    true, ahead = replicas
    sid = "sess-reserved-ahead"
    reserved = acquire(ahead, sid)  # its deadline: 3 h from now, as this machine's clock reads it
    assert reserved.record.lease.claim_status == pb.RESERVED
    granted = acquire(true, sid, wait=30)
    lease = granted.record.lease
    assert lease.fence == reserved.grant.fence + 1 and lease.claim_status == pb.RESERVED
    assert lease.death_evidence.kind == "reservation-unused", lease.death_evidence


@pytest.mark.parametrize("replicas", ["-3h"], indirect=True)
def test_a_replica_hours_behind_supersedes_an_unused_reservation_too(replicas) -> None:  # type: ignore[no-untyped-def]
    true, behind = replicas
    sid = "sess-reserved-behind"
    reserved = acquire(true, sid)  # to the replica 3 h behind, its deadline is 3 h away
    granted = acquire(behind, sid, wait=30)
    assert granted.record.lease.fence == reserved.grant.fence + 1
    assert granted.record.lease.death_evidence.kind == "reservation-unused"


@pytest.mark.parametrize("replicas", ["+3h"], indirect=True)
def test_a_reservation_whose_token_is_carried_is_kept_and_nothing_is_written(replicas) -> None:  # type: ignore[no-untyped-def]
    true, ahead = replicas
    sid = "sess-reserved-carried"
    reserved = acquire(ahead, sid)
    # A gate about to commit: a process carrying the reserved token under the agent's variable.
    carrier = subprocess.Popen(["sleep", "120"], env={**os.environ,
                                                      "HOLDFAST_SPAWN_TOKEN": reserved.grant.spawn_token})
    try:
        before = true.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record
        with pytest.raises(grpc.RpcError) as refused:
            acquire(true, sid, wait=5)  # past half the 4 s window: asked, and kept
        assert "RESERVED" in str(refused.value.details()) or "reserved" in str(refused.value.details())
        assert true.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record == before
    finally:
        carrier.kill()
        carrier.wait()
