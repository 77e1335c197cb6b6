"""Fencing's transitions each compare what they read (docs/transactions.md): two coordinator replicas
over one real etcd, the concurrent change made exactly between a decision's reads and its
transaction, and the transaction shown to lose (nothing written, the fence agent not run)."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from holdfast.coordinator import keys
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.fence_rules import FencerSpec
from holdfast.coordinator.host_fencing import FencingSettings
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Store, StoreUnavailable, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import (
    TOKEN_ENV,
    Context,
    InterferingStore,
    Pair,
    Refused,
    acquire,
    create,
    delete,
    record_of,
    register,
    touch,
    writes,
)

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)
HOST = "fence-txn-host"


def truthful_agent(tmp: Path) -> FencingSettings:
    """A fence agent that proves every host off, and logs each action it is asked."""
    program = tmp / "fence_truthful"
    program.write_text("#!/bin/sh\n" + textwrap.dedent(f"""\
        action=$(sed -n 's/^action=//p')
        echo "$action" >> {tmp / "agent.log"}
        [ "$action" = off ] && {{ echo "Success: Powered OFF"; exit 0; }}
        echo "Status: OFF"; exit 2
    """))
    program.chmod(0o755)
    return FencingSettings((FencerSpec(HOST, str(program)),), host_loss_after=3600, timeout=10)


@contextlib.asynccontextmanager
async def replicas(etcd: EtcdServer, prefix: str, tmp: Path) -> AsyncIterator[Pair]:
    """Two replicas fencing with the truthful agent; the victim's transactions can be interfered with."""
    settings = truthful_agent(tmp)
    p = Pair(CoordinatorService(InterferingStore(open_channel(etcd.url), prefix), fencing=settings,
                                name="victim"),
             CoordinatorService(Store(open_channel(etcd.url), prefix), fencing=settings, name="other"))
    try:
        yield p
    finally:
        await p.close()


def agent_runs(tmp: Path) -> list[str]:
    log = tmp / "agent.log"
    return log.read_text().split() if log.exists() else []


async def lost_with_a_reservation(p: Pair, sid: str) -> None:
    """HOST reserved `sid`, then its registration went: a host a fence may power off."""
    lease_id = await register(p.other, HOST)
    await acquire(p.other, p.ctx, sid, HOST)
    await p.other.store.revoke_lease(lease_id)


def fence_by_hand(p: Pair) -> Awaitable[pb.FenceHostResponse]:
    request = pb.FenceHostRequest(host_id=HOST, operator="test", reason="race")
    return p.victim.FenceHost(request, Context())  # type: ignore[return-value]


async def fence_touching(p: Pair, sid: str, written: str, touched: str) -> pb.FenceHostResponse:
    """A fence by hand of HOST (lost, with `sid` reserved there) during which another replica rewrites
    `touched` just before the victim's transaction that writes `written`."""
    await lost_with_a_reservation(p, sid)
    p.store.arm(writes(written), lambda: touch(p.other.store, touched))
    return await fence_by_hand(p)


CHANGES: dict[str, Callable[[Pair], Awaitable[object]]] = {
    "the host registers": lambda p: register(p.other, HOST),
    "a drain": lambda p: create(p.other.store, keys.draining(p.other.store, HOST)),
    "a restore gate": lambda p: create(p.other.store, keys.restore_pending(p.other.store)),
    "a new registered-last": lambda p: touch(p.other.store, keys.host_last(p.other.store, HOST)),
    "another replica's attempt": lambda p: create(p.other.store, keys.fence_pending(p.other.store, HOST)),
    "an attempt recorded": lambda p: create(p.other.store, keys.fence_history(p.other.store, HOST, 1)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@run_async
async def test_fence_pending_compares_every_gate_it_read(etcd: EtcdServer, prefix: str, tmp_path: Path,
                                                         change: str) -> None:
    async with replicas(etcd, prefix, tmp_path) as p:
        sid = "sess-fence-txn-1"
        await lost_with_a_reservation(p, sid)
        pending = keys.fence_pending(p.store, HOST)
        p.store.arm(writes(pending), lambda: CHANGES[change](p))  # type: ignore[arg-type, return-value]
        with pytest.raises(Refused) as refused:
            await fence_by_hand(p)
        assert refused.value.reason == "HOST_FENCING"
        assert p.store.outcomes_for(pending) == [False]
        assert agent_runs(tmp_path) == []  # nothing was run: a power-off cannot be called back
        assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]


async def registration_refused(p: Pair) -> str:
    """Why the victim's registration of HOST was refused; its one transaction lost, nothing written."""
    with pytest.raises(CoordinatorError) as refused:
        await register(p.victim, HOST)
    assert p.store.outcomes_for(keys.host(p.store, HOST)) == [False]
    assert await p.other.store.get(keys.host(p.store, HOST)) is None
    return refused.value.reason


@run_async
async def test_a_registration_that_lost_to_a_live_one_since_lapsed_is_host_live(
        etcd: EtcdServer, prefix: str, tmp_path: Path) -> None:
    # The registration it was compared with lapses between the lost transaction and the look at
    # why: no gate moved, so the answer is HOST_LIVE (ask again), never "a fence started".
    async with replicas(etcd, prefix, tmp_path) as p:
        host_key = keys.host(p.store, HOST)
        lease: list[int] = []

        async def live_one() -> None:
            lease.append(await register(p.other, HOST))

        p.store.arm(writes(host_key), live_one)
        plain_get = p.store.get

        async def get_after_the_lapse(key: str, revision: int = 0):  # type: ignore[no-untyped-def]
            if key == host_key and lease:
                await p.other.store.revoke_lease(lease.pop())
            return await plain_get(key, revision)

        p.store.get = get_after_the_lapse  # type: ignore[method-assign]
        assert await registration_refused(p) == "HOST_LIVE"


@run_async
async def test_a_registration_that_lost_to_a_fence_that_failed_since_is_host_fencing(
        etcd: EtcdServer, prefix: str, tmp_path: Path) -> None:
    # An attempt begins between the gates' read and the registration's transaction, and fails
    # before the look at why: its pending key is gone again and it left no proof, so the gates look
    # as first read. No registration held the id: the answer is HOST_FENCING (register again in a
    # moment), never HOST_LIVE, which names a live registration there was not.
    async with replicas(etcd, prefix, tmp_path) as p:
        host_key, pending = keys.host(p.store, HOST), keys.fence_pending(p.store, HOST)
        p.store.arm(writes(host_key), lambda: create(p.other.store, pending))
        plain_revoke = p.store.revoke_lease

        async def revoke_after_the_attempt_failed(lease_id: int) -> None:
            await delete(p.other.store, pending)
            await plain_revoke(lease_id)

        p.store.revoke_lease = revoke_after_the_attempt_failed  # type: ignore[method-assign]
        assert await registration_refused(p) == "HOST_FENCING" and await p.other.store.get(pending) is None


@run_async
async def test_registration_compares_the_fence_pending_key(etcd: EtcdServer, prefix: str,
                                                            tmp_path: Path) -> None:
    async with replicas(etcd, prefix, tmp_path) as p:
        host_key = keys.host(p.store, HOST)
        p.store.arm(writes(host_key), lambda: create(p.other.store, keys.fence_pending(p.other.store, HOST)))
        assert await registration_refused(p) == "HOST_FENCING"


@run_async
async def test_the_attempts_end_compares_its_pending_key(etcd: EtcdServer, prefix: str,
                                                          tmp_path: Path) -> None:
    async with replicas(etcd, prefix, tmp_path) as p:
        sid, proof = "sess-fence-txn-2", keys.fenced(p.store, HOST)
        response = await fence_touching(p, sid, proof, keys.fence_pending(p.store, HOST))
        # The device said off, but nothing recorded it: not a proof, and the operator is told so
        # (answered 'off', `admin fence` exited 0 as if the host were fenced).
        assert response.attempt.answer == "unknown" and list(response.results) == []
        assert "not recorded" in response.attempt.detail, response.attempt.detail
        assert [a.action for a in response.attempt.actions] == ["off", "status"]
        assert p.store.outcomes_for(proof) == [False]
        assert await p.other.store.get(proof) is None
        assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]


@run_async
async def test_each_session_freed_compares_the_proof(etcd: EtcdServer, prefix: str, tmp_path: Path) -> None:
    async with replicas(etcd, prefix, tmp_path) as p:
        sid = "sess-fence-txn-3"
        response = await fence_touching(p, sid, keys.session(p.store, sid), keys.fenced(p.store, HOST))
        assert response.attempt.answer == "off"
        assert [(r.session_id, r.recovered) for r in response.results] == [(sid, False)]
        assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]
        # Unchanged since, the proof frees it on the next pass (of any replica).
        await p.other.host_fencing.pass_once()
        freed = await record_of(p.other, sid)
        assert freed is not None and freed.lease.claim_status == pb.RELEASED
        assert freed.lease.death_evidence.kind == "host-fenced"


@run_async
async def test_hosts_shows_a_proof_as_fenced_only_for_the_incarnation_it_fenced(etcd: EtcdServer, prefix: str,
                                                                                tmp_path: Path) -> None:
    # `hosts` said "fenced" for a host back as a new incarnation and lost again before any fence of
    # that one: the last attempt was the old incarnation's proof.
    async with replicas(etcd, prefix, tmp_path) as p:
        await lost_with_a_reservation(p, "sess-fence-txn-4")
        assert (await fence_by_hand(p)).attempt.answer == "off"
        states = {s.host_id: s for s in await p.other.host_fencing.states(set())}
        assert states[HOST].state == "fenced"
        reborn = pb.HostRegistration(host_id=HOST, address="127.0.0.1:9", spawn_token_env=TOKEN_ENV,
                                     agent_version="test", incarnation=apb.HostIncarnation(boot_id="next"))
        lease_id, _ = await p.other.registry.register(reborn, 60)
        await p.other.store.revoke_lease(lease_id)
        states = {s.host_id: s for s in await p.other.host_fencing.states(set())}
        assert states[HOST].state == "" and states[HOST].attempt.answer == "off", states[HOST]


@run_async
async def test_a_fence_by_hand_runs_to_its_end_when_its_caller_goes(etcd: EtcdServer, prefix: str,
                                                                   tmp_path: Path) -> None:
    # The caller's deadline or Ctrl-C cancelled the attempt: its agent was killed mid-off, nothing
    # was recorded, and the host could not register until the pending key's lease lapsed.
    async with replicas(etcd, prefix, tmp_path) as p:
        sid, go = "sess-fence-txn-5", tmp_path / "go"
        await lost_with_a_reservation(p, sid)
        held = tmp_path / "fence_truthful"  # the replicas' agent, now waiting for the test
        held.write_text(held.read_text().replace("\n[", f"\nwhile [ ! -e {go} ]; do sleep 0.01; done\n[", 1))
        call = asyncio.ensure_future(fence_by_hand(p))
        while agent_runs(tmp_path) != ["off"]:
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        go.touch()
        for _ in range(1000):  # the proof, then the session it frees
            freed = await record_of(p.other, sid)
            if freed is not None and freed.lease.claim_status == pb.RELEASED:
                break
            await asyncio.sleep(0.01)
        assert freed is not None and freed.lease.death_evidence.kind == "host-fenced"
        assert agent_runs(tmp_path) == ["off", "status"]
        assert await p.other.store.get(keys.fenced(p.store, HOST)) is not None
        assert await p.other.store.get(keys.fence_pending(p.store, HOST)) is None


@run_async
async def test_a_recorded_proof_stands_when_its_lease_cannot_be_revoked(etcd: EtcdServer, prefix: str,
                                                                        tmp_path: Path) -> None:
    # The pending key is gone with the proof; its lease lapses by itself. A failed revoke raised
    # UNAVAILABLE to `admin fence` after the proof was recorded, and nothing was freed in that call.
    async with replicas(etcd, prefix, tmp_path) as p:
        sid = "sess-fence-txn-6"
        await lost_with_a_reservation(p, sid)

        async def unavailable(lease_id: int) -> None:
            raise StoreUnavailable("etcd went away")

        p.store.revoke_lease = unavailable  # type: ignore[method-assign]
        response = await fence_by_hand(p)
        assert response.attempt.answer == "off"
        assert [(r.session_id, r.recovered) for r in response.results] == [(sid, True)]
