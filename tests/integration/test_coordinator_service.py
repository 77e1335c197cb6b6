"""The coordinator over real etcd, real agents in simulated hosts (PID namespaces), real gRPC."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from aetcd import rpc

from holdfast.common.reasons import reason_of
from holdfast.coordinator.service import MAX_REPLAY
from holdfast.coordinator.store import Put, Store
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
REBOOT_BUDGET_S = 60.0


def stub(address: str) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(address))


def register(coord: coordinator_pb2_grpc.CoordinatorStub, host: SimulatedHost, ttl: int = 10) -> int:
    info = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(host.agent_address)).GetHostInfo(
        apb.GetHostInfoRequest(), timeout=5
    )
    reg = pb.HostRegistration(
        host_id=host.host_id,
        address=host.agent_address,
        incarnation=info.incarnation,
        spawn_token_env=info.spawn_token_env,
        agent_version=info.agent_version,
    )
    return coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=ttl), timeout=5).lease_id


def refused(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=30, **kwargs)
    return info.value.code(), reason_of(info.value)  # type: ignore[arg-type]


def acquire(coord, session: str, host: str, timeout: float = 30, **kw) -> pb.AcquireResponse:  # type: ignore[no-untyped-def]
    kw.setdefault("operation_id", secrets.token_hex(16))
    return coord.Acquire(
        pb.AcquireRequest(session_id=session, host_id=host, live_on_commit=True, **kw),
        timeout=timeout,
    )


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[SimulatedHost, SimulatedHost]]:
    a = SimulatedHost("host-a", 50, tmp_path / "a")
    b = SimulatedHost("host-b", 51, tmp_path / "b")
    a.start()
    try:
        b.start()
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def spawn_owner(host: SimulatedHost, grant: pb.Grant) -> subprocess.Popen[bytes]:
    env = {**os.environ, grant.spawn_token_env: grant.spawn_token}
    return host.spawn(["sleep", "300"], env=env)


def end(host: SimulatedHost, proc: subprocess.Popen[bytes]) -> None:
    os.kill(host.outer_pid(proc), signal.SIGKILL)
    proc.wait(5)


def test_full_cycle_tree_alive_secret_and_takeover(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    sid = "session-cycle-1"
    first = acquire(coord, sid, a.host_id).grant
    assert first.fence == 1
    owner = spawn_owner(a, first)
    try:
        rec = coord.CommitOwner(
            pb.CommitOwnerRequest(session_id=sid, fence=1, secret=first.secret, pid_hint=a.host_pid(owner)),
            timeout=30,
        ).record
        assert rec.lease.claim_status == pb.LIVE and rec.lease.owner.host_id == a.host_id
        put = pb.FencedPutRequest(session_id=sid, fence=1, secret=first.secret, key="k", value=b"v1")
        assert coord.FencedPut(put, timeout=10).revision > 0
        # A reader knows fence and token but not the secret: it can neither write nor release.
        wrong = secrets.token_hex(32)
        assert (
            refused(
                coord.FencedPut,
                pb.FencedPutRequest(session_id=sid, fence=1, secret=wrong, key="k", value=b"x"),
            )[1]
            == "PERMISSION_DENIED"
        )
        assert (
            refused(coord.Release, pb.ReleaseRequest(session_id=sid, fence=1, secret=wrong))[1]
            == "PERMISSION_DENIED"
        )
        # Host B's acquisition is adjudicated by A's agent: alive → HELD.
        assert refused(acquire, coord, sid, b.host_id) == (grpc.StatusCode.FAILED_PRECONDITION, "HELD")
        assert (
            refused(coord.Release, pb.ReleaseRequest(session_id=sid, fence=1, secret=first.secret))[1]
            == "TREE_ALIVE"
        )
    finally:
        end(a, owner)
    second = acquire(coord, sid, b.host_id).grant
    assert second.fence == 2
    # The stale owner's writes are refused and change nothing.
    code, reason = refused(coord.FencedPut, put)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "STALE_FENCE")
    assert (
        refused(
            coord.RecordProviderHandle,
            pb.RecordProviderHandleRequest(session_id=sid, fence=1, secret=first.secret, handle="h"),
        )[1]
        == "STALE_FENCE"
    )
    got = coord.FencedGet(pb.FencedGetRequest(session_id=sid, key="k"), timeout=10)
    assert got.found and got.value == b"v1"
    history = coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).history
    assert [h.transition for h in history] == ["grant", "commit", "grant"]


def test_unreachable_agent_is_never_a_grant_and_restart_keeps_writes(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a, ttl=2)
    register(coord, b)
    sid = "session-outage-1"
    grant = acquire(coord, sid, a.host_id).grant
    owner = spawn_owner(a, grant)
    coord.CommitOwner(
        pb.CommitOwnerRequest(session_id=sid, fence=1, secret=grant.secret, pid_hint=a.host_pid(owner)),
        timeout=30,
    )
    coord.FencedPut(
        pb.FencedPutRequest(session_id=sid, fence=1, secret=grant.secret, key="k", value=b"ack"), timeout=10
    )
    a.stop()  # the agent is gone (and so is its namespace): nothing may be granted on that basis
    assert refused(acquire, coord, sid, b.host_id)[1] == "OWNERSHIP_UNKNOWN"
    time.sleep(2.5)  # the registration's lease expires: that is time, and time grants nothing
    assert refused(acquire, coord, sid, b.host_id)[1] == "OWNERSHIP_UNKNOWN"
    # The owner's own release is not "tree alive" when nobody could look: it is unknown, and waits.
    release = pb.ReleaseRequest(session_id=sid, fence=1, secret=grant.secret)
    assert refused(coord.Release, release)[1] == "OWNERSHIP_UNKNOWN"
    coordinator.stop()
    coordinator.start()
    coord = stub(coordinator.address)
    got = coord.FencedGet(pb.FencedGetRequest(session_id=sid, key="k"), timeout=10)
    assert got.found and got.value == b"ack"
    assert coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record.lease.fence == 1


def test_32_racing_clients_one_grant_across_two_replicas(
    coordinator: Coordinator, hosts, etcd, tmp_path, prefix
) -> None:
    a, _ = hosts
    replica = Coordinator(etcd.url, tmp_path, prefix).start()
    try:
        stubs = [stub(coordinator.address), stub(replica.address)]
        register(stubs[0], a)
        sid = "session-race-32"

        def one(i: int) -> str:
            try:
                acquire(stubs[i % 2], sid, a.host_id)
                return "grant"
            except grpc.RpcError as exc:
                return reason_of(exc)  # type: ignore[arg-type]

        with ThreadPoolExecutor(32) as pool:
            outcomes = list(pool.map(one, range(32)))
        assert outcomes.count("grant") == 1
        assert set(outcomes) <= {"grant", "STALE_FENCE", "HELD", "RESERVED"}
        assert stubs[1].GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record.lease.fence == 1
    finally:
        replica.stop()


def test_second_agent_on_a_live_host_id_is_refused(coordinator: Coordinator, hosts) -> None:
    a, _ = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    with pytest.raises(grpc.RpcError) as info:
        register(coord, a)
    assert reason_of(info.value) == "HOST_LIVE"  # type: ignore[arg-type]
    assert [h.host_id for h in coord.ListHosts(pb.ListHostsRequest(), timeout=5).hosts] == [a.host_id]


def test_replay_returns_only_to_the_same_caller(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    op = secrets.token_hex(16)
    req = pb.AcquireRequest(session_id="session-replay", host_id=a.host_id, operation_id=op)
    first = coord.Acquire(req, timeout=30)
    assert coord.Acquire(req, timeout=30).grant.secret == first.grant.secret
    # Another caller (another host id) replaying the same operation id learns nothing of the first grant.
    other = pb.AcquireRequest(session_id="session-replay", host_id=b.host_id, operation_id=op)
    assert refused(coord.Acquire, other)[1] == "RESERVED"


def replay_leases(etcd_url: str, prefix: str, sid: str) -> list[int]:
    """The lease of each replay key the session has in etcd."""

    async def read() -> list[int]:
        store = Store.connect(etcd_url, prefix=prefix)
        try:
            entries, _ = await store.list_prefix(store.key("ops", sid, ""))
            return [e.lease for e in entries]
        finally:
            await store.close()

    return asyncio.run(read())


def revoke(etcd_url: str, lease: int) -> None:
    async def run() -> None:
        store = Store.connect(etcd_url)
        try:
            await store.revoke_lease(lease)
        finally:
            await store.close()

    asyncio.run(run())


def test_replay_memory_lapses_with_its_lease(coordinator: Coordinator, hosts, etcd, prefix) -> None:
    a, _ = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    sid = "session-replay-lease"
    req = pb.AcquireRequest(session_id=sid, host_id=a.host_id, operation_id=secrets.token_hex(16))
    first = coord.Acquire(req, timeout=30).grant
    [lease] = replay_leases(etcd.url, prefix, sid)
    assert lease != 0, "a replay key is bound to a lease, so replay keys cannot pile up in etcd"
    revoke(etcd.url, lease)  # what its expiry does, an hour on
    assert replay_leases(etcd.url, prefix, sid) == []
    # The retry is now a new request, adjudicated like any other: the first grant still holds.
    assert refused(coord.Acquire, req)[1] == "RESERVED"
    coord.Release(pb.ReleaseRequest(session_id=sid, fence=first.fence, secret=first.secret), timeout=10)
    # The coordinator's lease is gone too: its next grant notices, and binds the key to a new one.
    assert acquire(coord, sid, a.host_id).grant.fence == first.fence + 1
    assert [new for new in replay_leases(etcd.url, prefix, sid) if new not in (0, lease)]


def _own(coord, host: SimulatedHost, sid: str) -> tuple[pb.Grant, subprocess.Popen[bytes]]:  # type: ignore[no-untyped-def]
    grant = acquire(coord, sid, host.host_id).grant
    owner = spawn_owner(host, grant)
    request = pb.CommitOwnerRequest(
        session_id=sid, fence=grant.fence, secret=grant.secret, pid_hint=host.host_pid(owner)
    )
    coord.CommitOwner(request, timeout=30)
    return grant, owner


def register_after_lapse(coord, host: SimulatedHost, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Registers host once its previous registration's 2 s lease has lapsed (refused HOST_LIVE until)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            register(coord, host, ttl=2)
            return
        except grpc.RpcError as err:
            if reason_of(err) != "HOST_LIVE" or time.monotonic() > deadline:  # type: ignore[arg-type]
                raise
        time.sleep(0.1)


def _rebooted_owner(coord, a, b, sid: str, keep_old_namespace: bool):  # type: ignore[no-untyped-def]
    """Host a owns sid, then reboots: (old pid ns inode, the new incarnation a registers)."""
    register(coord, a, ttl=2)
    taker_lease = register(coord, b)
    _own(coord, a, sid)
    assert coord.ProbeSession(pb.ProbeSessionRequest(session_id=sid), timeout=30).verdict == "held"
    owner = coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record.lease.owner
    old_ns = owner.incarnation.pid_ns
    # An open handle keeps the old namespace alive, so the kernel must give the new one another inode.
    held = os.open(f"/proc/{a.reaper_pid}/ns/pid", os.O_RDONLY) if keep_old_namespace else None
    try:
        # The kernel gives a new namespace the lowest free inode number, so a freed one is usually
        # reused at once; but every namespace made anywhere on the machine (other tests, another run
        # of the suite beside this one) may take it first, hence tries. A try asks the new agent for
        # its incarnation directly, so a miss costs one reboot, not a registration's lapse.
        deadline = time.monotonic() + REBOOT_BUDGET_S
        while True:
            a.reboot()
            new = (agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(a.agent_address))
                   .GetHostInfo(apb.GetHostInfoRequest(), timeout=5).incarnation)
            if keep_old_namespace or new.pid_ns == old_ns:
                break
            assert time.monotonic() < deadline, f"no reboot reused the namespace inode in {REBOOT_BUDGET_S} s"
            # b, the taker, has no agent heartbeating for it here: keep its registration live.
            coord.Heartbeat(pb.HeartbeatRequest(host_id=b.host_id, lease_id=taker_lease), timeout=5)
        register_after_lapse(coord, a)  # the old registration lapses; the new incarnation registers
        coord.Heartbeat(pb.HeartbeatRequest(host_id=b.host_id, lease_id=taker_lease), timeout=5)
        return old_ns, new
    finally:
        if held is not None:
            os.close(held)


def test_reboot_into_the_same_namespace_inode_grants_by_incarnation(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    sid = "session-reboot-1"
    old_ns, new = _rebooted_owner(coord, a, b, sid, keep_old_namespace=False)
    assert new.pid_ns == old_ns
    assert acquire(coord, sid, b.host_id).grant.fence == 2
    evidence = coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record.lease.death_evidence
    assert evidence.kind == "identity-mismatch"


def test_reboot_into_another_namespace_inode_needs_recover(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    sid = "session-reboot-2"
    old_ns, new = _rebooted_owner(coord, a, b, sid, keep_old_namespace=True)
    assert new.pid_ns != old_ns
    # Another inode: the old namespace may still exist (here it does), so only an operator frees it.
    assert refused(acquire, coord, sid, b.host_id)[1] == "OWNERSHIP_UNKNOWN"
    recover = pb.RecoverRequest(session_id=sid, expected_fence=1, reason="host replaced", operator="test")
    assert coord.Recover(recover, timeout=10).record.lease.death_evidence.kind == "operator-asserted"
    assert acquire(coord, sid, b.host_id).grant.fence == 2


def test_recover_invalidates_the_fence_and_handoff_conflicts(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    sid = "session-recover-1"
    grant, owner = _own(coord, a, sid)
    try:
        op = secrets.token_hex(16)
        coord.RequestHandoff(
            pb.RequestHandoffRequest(session_id=sid, operation_id=op, host_id=b.host_id), timeout=10
        )
        other = pb.RequestHandoffRequest(
            session_id=sid, operation_id=secrets.token_hex(16), host_id=b.host_id
        )
        assert refused(coord.RequestHandoff, other) == (grpc.StatusCode.ABORTED, "OPERATION_CONFLICT")
        assert (
            refused(
                coord.Recover, pb.RecoverRequest(session_id=sid, expected_fence=9, reason="r", operator="o")
            )[1]
            == "STALE_FENCE"
        )
        coord.Recover(
            pb.RecoverRequest(session_id=sid, expected_fence=1, reason="stuck", operator="ops"), timeout=10
        )
        put = pb.FencedPutRequest(session_id=sid, fence=1, secret=grant.secret, key="k", value=b"late")
        assert refused(coord.FencedPut, put)[1] == "NOT_LIVE"
        assert not coord.FencedGet(pb.FencedGetRequest(session_id=sid, key="k"), timeout=10).found
    finally:
        end(a, owner)


def test_watch_sessions_lists_then_streams(coordinator: Coordinator, hosts) -> None:
    a, _ = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    acquire(coord, "session-watch-1", a.host_id)
    stream = coord.WatchSessions(pb.WatchSessionsRequest(), timeout=20)
    first = next(stream)
    assert first.resync and first.record.session_id == "session-watch-1"
    acquire(coord, "session-watch-2", a.host_id)
    second = next(stream)
    assert not second.resync and second.record.session_id == "session-watch-2"
    stream.cancel()


def handoff_requested(coordinator: Coordinator, hosts, sid: str,  # type: ignore[no-untyped-def]
                      ) -> tuple[coordinator_pb2_grpc.CoordinatorStub, pb.AcquireResponse]:
    """`sid` granted on the first host, then its handoff requested by the second."""
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    granted = acquire(coord, sid, a.host_id)
    coord.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=secrets.token_hex(16),
                                                  host_id=b.host_id), timeout=10)
    return coord, granted


def test_an_owners_watch_from_its_grant_revision_lists_nothing_and_misses_no_change(
    coordinator: Coordinator, hosts
) -> None:
    """`after_revision` (the grant's): the stream starts with the first change after the grant,
    even one made before it opened, never a listing; compacted past it, a replica whose shared watch
    does not hold every change since (opened after the handoff request: test_watch_fanout.py has one
    that does) lists, and so does a restarted one."""
    sid = "session-watch-after"
    coord, granted = handoff_requested(coordinator, hosts, sid)
    assert granted.revision > 0
    # The last: a watch at the int64's top cannot be made; refused, it leaves the coordinator's
    # shared etcd watch stream as it was, so the owner's watch below still hears its handoff.
    for bad in (pb.WatchSessionsRequest(session_id=sid, after_revision=-1),
                pb.WatchSessionsRequest(after_revision=granted.revision),
                pb.WatchSessionsRequest(session_id="someone-else", after_revision=2**63 - 1)):
        with pytest.raises(grpc.RpcError) as info:
            next(coord.WatchSessions(bad, timeout=20))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    stream = coord.WatchSessions(pb.WatchSessionsRequest(session_id=sid, after_revision=granted.revision),
                                 timeout=20)
    opening, first = next(stream), next(stream)  # the opening event names the cluster, with no record
    assert not opening.HasField("record") and opening.cluster_id and not opening.resync
    assert not first.resync and first.record.lease.handoff_stage == pb.HANDOFF_REQUESTED
    assert first.cluster_id == opening.cluster_id
    stream.cancel()

    async def compact() -> None:
        store = Store.connect(coordinator.etcd_url, prefix=coordinator.prefix)
        try:
            _, now = await store.txn([], [Put(store.key("unrelated"), b"x")])  # past the handoff's
            await rpc.KVStub(store.channel).Compact(rpc.CompactionRequest(revision=now, physical=True))
        finally:
            await store.close()

    asyncio.run(compact())
    watch = pb.WatchSessionsRequest(session_id=sid, after_revision=granted.revision)
    stream = coord.WatchSessions(watch, timeout=20)
    opening, first = next(stream), next(stream)
    assert not opening.HasField("record")
    assert first.resync and first.record.lease.handoff_stage == pb.HANDOFF_REQUESTED
    stream.cancel()
    coordinator.stop()  # a replica with no shared watch yet: the grant's revision is etcd's to answer
    coordinator.start()
    stream = stub(coordinator.address).WatchSessions(watch, timeout=20)
    opening, first = next(stream), next(stream)
    assert not opening.HasField("record")
    assert first.resync and first.record.lease.handoff_stage == pb.HANDOFF_REQUESTED
    stream.cancel()


def test_an_after_revision_far_behind_lists_instead_of_replaying_etcds_history(
    coordinator: Coordinator, hosts
) -> None:
    """etcd reads every change of every key since a watch's start to find its events: a caller's
    after_revision more than MAX_REPLAY revisions old (any tenant can send one) lists instead."""
    sid = "session-watch-far-behind"
    coord, granted = handoff_requested(coordinator, hosts, sid)

    async def noise() -> None:
        store = Store.connect(coordinator.etcd_url, prefix=coordinator.prefix)
        try:
            async def writer(n: int) -> None:
                for i in range(n):
                    await store.txn([], [Put(store.key("noise", str(i % 8)), b"x")])

            await asyncio.gather(*(writer(MAX_REPLAY // 8 + 1) for _ in range(8)))
        finally:
            await store.close()

    asyncio.run(noise())
    acquire(coord, "session-watch-far-behind-2", hosts[0].host_id)  # the coordinator sees etcd's revision
    stream = coord.WatchSessions(pb.WatchSessionsRequest(session_id=sid, after_revision=granted.revision),
                                 timeout=20)
    first = next(stream)
    assert first.resync and first.record.lease.handoff_stage == pb.HANDOFF_REQUESTED
    stream.cancel()


def test_wait_seconds_grants_on_the_owners_exit_event(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    sid = "session-wait-1"
    _, owner = _own(coord, a, sid)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(acquire, coord, sid, b.host_id, wait_seconds=20)
        time.sleep(0.5)
        assert not waiting.done()  # held open while the owner lives
        end(a, owner)
        assert waiting.result(timeout=15).grant.fence == 2


def test_force_kills_the_owner_tree_through_its_agent_then_grants(coordinator: Coordinator, hosts) -> None:
    a, b = hosts
    coord = stub(coordinator.address)
    register(coord, a)
    register(coord, b)
    sid = "session-force-1"
    _, owner = _own(coord, a, sid)
    assert refused(acquire, coord, sid, b.host_id)[1] == "HELD"
    # force is honoured only for the operation whose handoff request the record holds (docs/design.md §5)
    assert refused(acquire, coord, sid, b.host_id, force=True)[1] == "FORCE_NOT_ALLOWED"
    assert owner.poll() is None
    op = secrets.token_hex(16)
    coord.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=op, host_id=b.host_id),
                         timeout=10)
    assert acquire(coord, sid, b.host_id, force=True, operation_id=op).grant.fence == 2
    owner.wait(10)  # the owner really is gone: its nsenter parent saw it die
    history = coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=5).history
    assert [h.transition for h in history][-3:] == ["handoff-requested", "force-pending", "grant"]
