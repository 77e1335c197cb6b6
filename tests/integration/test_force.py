"""`force` per docs/design.md §5, with real agents in simulated hosts: a forced Acquire that would be
refused kills nothing and writes nothing; only the caller whose handoff request the record holds
has the owner's agent end the owner (the legitimate `run --takeover --force` flow is
test_run_sessions.py::test_frozen_owner_is_refused_then_force_has_its_agent_end_it)."""

from __future__ import annotations

import asyncio
import os
import secrets

import grpc
import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import BadInput
from holdfast.common.reasons import reason_of
from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster
from tests.integration.test_record_size import handle
from tests.integration.test_run_sessions import child_pids, frozen_owner, gone, started

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


def test_a_takeover_of_a_live_owner_whose_record_is_oversized_leaves_it_running_and_writes_nothing(
        cluster: Cluster) -> None:
    """A record too large for its grant's transaction (handles recorded before the chain's byte cap)
    is refused RECORD_TOO_LARGE before the takeover asks the owner to end, and before a forced one
    writes force-pending or kills: the grant would fail at etcd only after the owner had ended."""
    a = cluster.host("host-a")
    cluster.host("host-b")
    sid = "sess-force-oversized"
    first = cluster.run(a, sid)
    started(cluster, 1)
    child = child_pids(first)[0]
    record = cluster.record(sid).record
    for i in range(200):
        record.provider_handle_chain.add(handle=handle(i), minted_at_fence=1, observed_at_unix_ms=1)
    cluster.etcd_put(f"sessions/{sid}", records.encode(record))
    before = cluster.record(sid)
    operation = secrets.token_hex(16)
    for kind in ({"wait_seconds": 20}, {"force": True}):
        request = pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id=operation, takeover=True,
                                    live_on_commit=True, **kind)  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as err:
            cluster.stub.Acquire(request, timeout=60)
        assert reason_of(err.value) == "RECORD_TOO_LARGE", (kind, err.value)  # type: ignore[arg-type]
        assert cluster.record(sid) == before, f"a refused takeover {kind} wrote nothing"
    assert not gone(child), "a refused takeover ended the owner"
    assert first.proc.poll() is None and not cluster.events("stop")


def test_a_forced_acquire_awaiting_release_is_refused_before_it_kills(cluster: Cluster) -> None:
    """`force` has the owner's agent kill its tree, and a killed owner never releases: with
    `await_release` the Acquire could only kill and then be refused RELEASE_PENDING, the session kept
    for it. The pair is refused INVALID_ARGUMENT before anything is read, written or signalled, and
    the library refuses it before sending."""
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-force-await"
    with frozen_owner(cluster, a, sid) as (first, child):
        operation = secrets.token_hex(16)
        # The force is honoured for this operation: without the check, its kill would land.
        cluster.stub.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=operation,
                                                             host_id="host-b"), timeout=30)
        before = cluster.record(sid)
        request = pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id=operation, takeover=True,
                                    force=True, await_release=True, live_on_commit=True)
        with pytest.raises(grpc.RpcError) as err:
            cluster.stub.Acquire(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value  # type: ignore[attr-defined]
        assert "force and await_release" in err.value.details()  # type: ignore[attr-defined]

        async def library() -> None:
            client = Client(cluster.coordinator.address, "host-b")
            try:
                await client.acquire(sid, operation, takeover=True, force=True, await_release=True)
            finally:
                await client.close()

        with pytest.raises(BadInput, match="force and await_release"):
            asyncio.run(library())
        assert not gone(child), "a refused force killed the owner"
        assert cluster.record(sid) == before, "a refused force wrote something"
    first.wait(30)  # A's run wakes to the handoff request standing, and ends its tree
