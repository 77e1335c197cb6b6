"""`force` per docs/design.md §5, with real agents in simulated hosts: a forced Acquire that would be
refused kills nothing and writes nothing; only the caller whose handoff request the record holds
has the owner's agent end the owner (the legitimate `run --takeover --force` flow is
test_run_sessions.py::test_frozen_owner_is_refused_then_force_has_its_agent_end_it)."""

from __future__ import annotations

import os
import secrets

import grpc
import pytest

from holdfast.common.reasons import reason_of
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster
from tests.integration.test_run_sessions import child_pids, gone, started

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


def forced(cluster: Cluster, sid: str, host_id: str) -> str:
    """A forced Acquire under a fresh operation id (so no handoff request of its own): its refusal."""
    request = pb.AcquireRequest(session_id=sid, host_id=host_id, operation_id=secrets.token_hex(16),
                                force=True, live_on_commit=True)
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Acquire(request, timeout=30)
    return reason_of(err.value)  # type: ignore[arg-type]


@pytest.mark.parametrize("taker", ["host-nowhere", "host-b"])
def test_a_refused_force_leaves_the_live_owner_running_and_writes_nothing(
        cluster: Cluster, taker: str) -> None:
    a = cluster.host("host-a")
    if taker == "host-b":
        cluster.host("host-b")  # registered, but it never asked for a handoff
    sid = "sess-force-refused"
    first = cluster.run(a, sid)
    started(cluster, 1)
    child = child_pids(first)[0]
    before = cluster.record(sid).record
    reason = forced(cluster, sid, taker)
    assert reason in ("HOST_NOT_REGISTERED", "FORCE_NOT_ALLOWED")
    assert not gone(child), "a refused force killed the owner"
    after = cluster.record(sid).record
    assert after == before and after.lease.fence == 1
    assert first.proc.poll() is None
