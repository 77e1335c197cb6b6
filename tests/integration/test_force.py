"""`force` per docs/design.md §5, with real agents in simulated hosts: a forced Acquire that would be
refused kills nothing and writes nothing; only the caller whose handoff request the record holds
has the owner's agent end the owner (the legitimate `run --takeover --force` flow is
test_run_sessions.py::test_frozen_owner_is_refused_then_force_has_its_agent_end_it)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import BadInput
from holdfast.common.reasons import reason_of
from holdfast.coordinator import records
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.run_fixtures import Cluster, until
from tests.integration.test_agent_dropped_jobs import sample
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


def honoured(cluster: Cluster, sid: str, **fields: object) -> pb.AcquireRequest:
    """host-b's forced takeover of `sid` under an operation whose handoff request the record holds:
    the force is honoured, and its kill would land."""
    operation = secrets.token_hex(16)
    cluster.stub.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=operation,
                                                         host_id="host-b"), timeout=30)
    return pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id=operation, takeover=True,
                             force=True, live_on_commit=True, **fields)  # type: ignore[arg-type]


def test_a_forced_acquire_awaiting_release_is_refused_before_it_kills(cluster: Cluster) -> None:
    """`force` has the owner's agent kill its tree, and a killed owner never releases: with
    `await_release` the Acquire could only kill and then be refused RELEASE_PENDING, the session kept
    for it. The pair is refused INVALID_ARGUMENT before anything is read, written or signalled, and
    the library refuses it before sending."""
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-force-await"
    with frozen_owner(cluster, a, sid) as (first, child):
        request = honoured(cluster, sid, await_release=True)  # without the check, its kill would land
        before = cluster.record(sid)
        with pytest.raises(grpc.RpcError) as err:
            cluster.stub.Acquire(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value  # type: ignore[attr-defined]
        assert "force and await_release" in err.value.details()  # type: ignore[attr-defined]

        async def library() -> None:
            client = Client(cluster.coordinator.address, "host-b")
            try:
                await client.acquire(sid, request.operation_id, takeover=True, force=True, await_release=True)
            finally:
                await client.close()

        with pytest.raises(BadInput, match="force and await_release"):
            asyncio.run(library())
        assert not gone(child), "a refused force killed the owner"
        assert cluster.record(sid) == before, "a refused force wrote something"
    first.wait(30)  # A's run wakes to the handoff request standing, and ends its tree


def agent_pid(host: SimulatedHost) -> int:
    """The simulated host's agent: the child of its namespace's reaper that serves."""
    reaper = host.reaper_pid
    kids = Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split()
    return next(int(k) for k in kids if b"serve" in Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0"))


def test_a_forced_acquire_whose_kill_is_indeterminate_is_refused_saying_so_and_continued_by_its_retry(
        cluster: Cluster) -> None:
    """The owner's agent stopped: the kill authorised by force-pending gets no answer, so nothing
    proves the tree gone and nothing is granted. The refusal is the documented one that wrote (its
    force-pending record stands, and the kill may land): it says so, and that the same operation
    continues it — which, its agent back, has the tree ended and is granted."""
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-force-unknown"
    with frozen_owner(cluster, a, sid) as (first, child):
        request = honoured(cluster, sid)
        agent = agent_pid(a)
        os.kill(agent, signal.SIGSTOP)
        try:
            with pytest.raises(grpc.RpcError) as err:
                cluster.stub.Acquire(request, timeout=60)
        finally:
            os.kill(agent, signal.SIGCONT)
        assert reason_of(err.value) == "OWNERSHIP_UNKNOWN", err.value  # type: ignore[arg-type]
        said = err.value.details()  # type: ignore[attr-defined]
        assert "kill was asked" in said and "force-pending record stands" in said, said
        assert "same operation id" in said and "continues it" in said, said
        lease = cluster.record(sid).record.lease
        assert lease.fence == 1 and lease.handoff_stage == pb.FORCE_PENDING, lease  # never granted
        granted = cluster.stub.Acquire(request, timeout=60)
        assert granted.grant.fence == 2
        assert gone(child, 10), "granted while the owner's tree lived"
    first.wait(30)


@pytest.fixture
def measured(etcd, tmp_path: Path, prefix: str) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """A cluster whose coordinator serves /metrics."""
    coordinator = Coordinator(etcd.url, tmp_path, prefix, args=("--metrics-listen", "127.0.0.1:0")).start()
    cluster = Cluster(coordinator, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()
        coordinator.stop()


def test_a_forced_acquire_waits_on_the_owners_exit_after_a_kill_that_proved_nothing(
        measured: Cluster) -> None:
    """With `wait_seconds` (what `run --takeover --force` sends: the kill's wait and its --grace),
    a kill that got no answer is not refused at once: the Acquire waits on the owner's exit stream,
    and is granted on its agent's proof once that agent answers — never before."""
    cluster = measured
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-force-waits"
    with frozen_owner(cluster, a, sid) as (first, child):
        request = honoured(cluster, sid, wait_seconds=60)
        agent = agent_pid(a)
        os.kill(agent, signal.SIGSTOP)
        try:
            forced = cluster.stub.Acquire.future(request, timeout=90)
            metrics = cluster.coordinator.metrics
            until("the forced Acquire waiting on the owner's exit after its unanswered kill",
                  lambda: forced.done() or sample(metrics, "holdfast_acquires_waiting") == 1)
            assert not forced.done(), forced.exception()
            assert not gone(child) and cluster.record(sid).record.lease.fence == 1
        finally:
            os.kill(agent, signal.SIGCONT)
        granted = forced.result(60)
        assert granted.grant.fence == 2
        assert gone(child, 10), "granted while the owner's tree lived"
        assert granted.record.lease.death_evidence.owner_fence == 1
    first.wait(30)
