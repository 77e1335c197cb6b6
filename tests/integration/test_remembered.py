"""A release that follows this replica's own grant, and an acquire of a session this replica
released, start from the record it wrote, not a read (coordinator/remembered.py), over a real etcd:
they read nothing when nothing changed since, and a remembered record that another replica's write
made stale can only lose its transaction or be decided again on a fresh read — never grant,
release, or refuse what a fresh read would not."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest

from holdfast.common import spawn_tokens
from holdfast.coordinator import keys, records
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Entry, Put, Seen, Store, open_channel, unchanged
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import (
    TOKEN_ENV,
    Pair,
    Refused,
    acquire,
    create,
    delete,
    pair,
    record_of,
    register,
    release,
    touch,
)

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(60)]
HOST = "host-remembered"


@contextlib.asynccontextmanager
async def victim_granted(etcd: EtcdServer, prefix: str,
                         sid: str) -> AsyncIterator[tuple[Pair, pb.AcquireResponse]]:
    """Two replicas over one etcd, and `sid` granted by the victim (which remembers its record)."""
    p = pair(etcd, prefix)
    try:
        await register(p.victim, HOST)
        yield p, await acquire(p.victim, p.ctx, sid, HOST)
    finally:
        await p.close()


class Reads:
    """Counts the reads of session records the victim replica sends to etcd."""

    def __init__(self, p: Pair) -> None:
        self.count = 0
        store = p.store
        plain = store.get

        async def get(key: str) -> Entry | None:
            self.count += key.startswith(store.key("sessions", ""))
            return await plain(key)

        store.get = get  # type: ignore[method-assign]


class Requests:
    """Counts the requests the victim replica sends to etcd, by kind (TxnRequest, RangeRequest...)."""

    def __init__(self, p: Pair) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        plain = p.store._call

        async def call(method, request):  # type: ignore[no-untyped-def]
            self.counts[type(request).__name__] += 1
            return await plain(method, request)

        p.store._call = call  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def following(svc: CoordinatorService) -> AsyncIterator[None]:
    """The replica's registration cache following etcd, as a serving coordinator's does: the gates
    of a grant on remembered reads need the host's registration from it."""
    follow = asyncio.create_task(svc.registry.follow())
    try:
        await asyncio.wait_for(svc.registry.following.wait(), 10)
        yield
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)


@contextlib.asynccontextmanager
async def victim_released(etcd: EtcdServer, prefix: str, sid: str) -> AsyncIterator[Pair]:
    """`sid` granted and released by the victim, which remembers it released and follows the
    registrations: its next Acquire of `sid` may start from its memory."""
    async with victim_granted(etcd, prefix, sid) as (p, granted), following(p.victim):
        await release(p.victim, p.ctx, granted.grant)
        yield p


@run_async
async def test_an_acquire_after_this_replicas_release_makes_no_read(etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-acquire-1"
    async with victim_released(etcd, prefix, sid) as p:
        requests = Requests(p)
        again = await acquire(p.victim, p.ctx, sid, HOST)
        await release(p.victim, p.ctx, again.grant)
        assert again.grant.fence == 2
        # The cycle's read transaction is gone: the grant's and the release's are all it sends.
        assert requests.counts == {"TxnRequest": 2}, requests.counts
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, True, True, True]


async def rewritten(p: Pair, sid: str) -> None:
    await touch(p.other.store, p.key("sessions", sid))  # by another replica


async def other_bytes_at_its_revision(p: Pair, sid: str) -> None:
    # An etcd restored from a backup may give the remembered mod revision to other bytes: here the
    # victim remembers, at etcd's revision, the record released at fence 5 where etcd holds fence 1.
    entry, record = await p.victim.sessions.require(sid)
    record.lease.fence = 5
    p.victim.sessions.remembered.wrote(replace(entry, value=records.encode(record)))


@pytest.mark.parametrize("stale", [rewritten, other_bytes_at_its_revision])
@run_async
async def test_a_stale_memory_loses_then_the_acquire_is_decided_on_a_fresh_read(
        etcd: EtcdServer, prefix: str, stale: Callable[[Pair, str], Awaitable[None]]) -> None:
    sid = f"sess-remembered-{stale.__name__}"
    async with victim_released(etcd, prefix, sid) as p:
        await stale(p, sid)
        again = await acquire(p.victim, p.ctx, sid, HOST)
        assert again.grant.fence == 2, "granted on etcd's record, read afresh, not on the remembered one"
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, True, False, True], \
            "grant; release; the grant on the remembered record lost; the grant on the fresh read applied"


@run_async
async def test_a_session_taken_by_another_replica_since_is_refused_on_a_fresh_read(
        etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-acquire-3"
    async with victim_released(etcd, prefix, sid) as p:
        taken = await acquire(p.other, p.ctx, sid, HOST)  # fence 2, reserved, by the other replica
        # The victim remembers fence 1 released, which it would grant on: etcd holds fence 2 reserved.
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, p.ctx, sid, HOST)
        assert refused.value.reason == "RESERVED"
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, True, False], \
            "the grant on the remembered record lost; the fresh read refused, writing nothing"
        record = await record_of(p.other, sid)
        assert record is not None and record.lease == taken.record.lease


@run_async
async def test_a_gate_not_attested_on_a_remembered_record_is_refused_as_a_fresh_read_refuses(
        etcd: EtcdServer, prefix: str) -> None:
    # On the remembered record (released) the gate is attested before the grant, and its host's
    # address answers nothing: that refusal is not the remembered record's to make. On etcd's record
    # (reserved by another replica since) the Acquire is refused RESERVED before any gate is attested.
    sid = "sess-remembered-acquire-8"
    async with victim_released(etcd, prefix, sid) as p:
        await acquire(p.other, p.ctx, sid, HOST)
        secret = spawn_tokens.mint_spawn_secret()
        gate = pb.GateSpawn(pid_hint=1, token_secret=secret, spawn_token_env=TOKEN_ENV)
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, p.ctx, sid, HOST, gate=gate)
        assert refused.value.reason == "RESERVED"


@run_async
async def test_a_refusal_on_a_remembered_record_is_the_fresh_reads(etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-acquire-4"
    async with victim_released(etcd, prefix, sid) as p:
        second = await acquire(p.other, p.ctx, sid, HOST)
        await release(p.other, p.ctx, second.grant)  # fence 2 released, by the other replica
        requests = Requests(p)
        # On the remembered record (fence 1) an expected fence of 2 is stale; on etcd's it is current.
        third = await acquire(p.victim, p.ctx, sid, HOST, expected_fence=2, has_expected_fence=True)
        assert third.grant.fence == 3
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, True, True], \
            "the refusal on the remembered record wrote nothing; the fresh read granted"
        assert requests.counts == {"TxnRequest": 2}, "one read, one grant"


@run_async
async def test_a_retried_operation_is_replayed_or_refused_on_a_fresh_read(
        etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-acquire-5"
    retried = "0f" * 16
    async with victim_released(etcd, prefix, sid) as p:
        first = await acquire(p.victim, p.ctx, sid, HOST, operation_id=retried)
        assert (await acquire(p.victim, p.ctx, sid, HOST, operation_id=retried)).grant == first.grant
        await release(p.victim, p.ctx, first.grant)
        later = await acquire(p.victim, p.ctx, sid, HOST)
        await release(p.victim, p.ctx, later.grant)
        # The victim remembers the record released at the later fence, which it would grant on; the
        # operation's key in etcd, taken as absent, makes that grant lose, and the fresh read refuses.
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, p.ctx, sid, HOST, operation_id=retried)
        assert refused.value.reason == "STALE_FENCE"
        assert p.store.outcomes_for(p.key("sessions", sid))[-1] is False


@run_async
async def test_a_gate_taken_open_but_closed_in_etcd_is_refused_on_a_fresh_read(
        etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-acquire-6"
    async with victim_released(etcd, prefix, sid) as p:
        await create(p.other.store, keys.draining(p.other.store, HOST))
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, p.ctx, sid, HOST)
        assert refused.value.reason == "HOST_DRAINING"
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, True, False]


@run_async
async def test_a_remembered_entry_is_compared_on_its_bytes_not_only_its_revision(
        etcd: EtcdServer, prefix: str) -> None:
    # An etcd restored from a backup may give the remembered mod revision to other bytes: the
    # remembered reading must then lose, where a reading compared on its revision alone would not.
    store = Store(open_channel(etcd.url), prefix)
    try:
        key, decision = store.key("sessions", "sess-bytes"), store.key("decision")
        await store.txn([], [Put(key, b"as etcd holds it")])
        held = await store.get(key)
        assert held is not None
        other_bytes = replace(held, value=b"as this replica remembered it")
        ok, _ = await store.txn(unchanged([Seen(key, other_bytes, remembered=True)]), [Put(decision, b"x")])
        assert not ok and await store.get(decision) is None
        ok, _ = await store.txn(unchanged([Seen(key, other_bytes)]), [Put(decision, b"x")])
        assert ok, "compared on its revision alone, the other bytes pass: the byte compare is what refuses"
        # Read and remembered alike at one revision: the byte compare is kept, whichever came first.
        compares = unchanged([Seen(key, other_bytes), Seen(key, other_bytes, remembered=True)])
        assert len(compares) == 2 and compares[1].value == other_bytes.value
    finally:
        await store.close()


@run_async
async def test_a_release_after_this_replicas_grant_reads_nothing(etcd: EtcdServer, prefix: str) -> None:
    async with victim_granted(etcd, prefix, "sess-remembered-1") as (p, granted):
        reads = Reads(p)
        released = await release(p.victim, p.ctx, granted.grant)
        assert released.record.lease.claim_status == pb.RELEASED
        assert reads.count == 0, "the grant's own write was the record released"
        assert (await record_of(p.other, "sess-remembered-1")).lease.claim_status == pb.RELEASED  # type: ignore[union-attr]


@run_async
async def test_a_stale_memory_loses_then_the_release_is_decided_on_a_fresh_read(
        etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-2"
    async with victim_granted(etcd, prefix, sid) as (p, granted):
        await touch(p.other.store, p.key("sessions", sid))  # another replica rewrote it since
        reads = Reads(p)
        released = await release(p.victim, p.ctx, granted.grant)
        assert released.record.lease.claim_status == pb.RELEASED
        assert p.store.outcomes_for(p.key("sessions", sid)) == [True, False, True], \
            "grant; the release on the remembered record lost; the release on the fresh read applied"
        assert reads.count == 1


@run_async
async def test_a_remembered_fence_never_decides_a_refusal_or_a_release(etcd: EtcdServer, prefix: str) -> None:
    sid = "sess-remembered-3"
    async with victim_granted(etcd, prefix, sid) as (p, first):  # remembered by the victim at fence 1
        await release(p.other, p.ctx, first.grant)
        second = await acquire(p.other, p.ctx, sid, HOST)  # fence 2, by the other replica
        # The victim remembers fence 1 reserved: on that the first grant's release would pass, but
        # etcd holds fence 2. Its transaction loses, and the fresh read refuses it.
        with pytest.raises(Refused) as refused:
            await release(p.victim, p.ctx, first.grant)
        assert refused.value.reason == "STALE_FENCE"
        record = await record_of(p.other, sid)
        assert record is not None and (record.lease.fence, record.lease.claim_status) == (2, pb.RESERVED)
        # And the second grant, which the remembered fence 1 would refuse, is released on a fresh read.
        released = await release(p.victim, p.ctx, second.grant)
        assert (released.record.lease.fence, released.record.lease.claim_status) == (2, pb.RELEASED)


@run_async
async def test_a_refusal_of_malformed_input_on_a_remembered_record_is_the_fresh_reads(
        etcd: EtcdServer, prefix: str) -> None:
    # The victim remembers its grant; the record is gone from etcd since (as after an archive). A
    # release with a malformed fence is, on a fresh read, NOT_FOUND: the remembered record must not
    # answer INVALID_ARGUMENT for a session etcd no longer holds.
    sid = "sess-remembered-4"
    async with victim_granted(etcd, prefix, sid) as (p, granted):
        await delete(p.other.store, p.key("sessions", sid))
        malformed = pb.Grant()
        malformed.CopyFrom(granted.grant)
        malformed.fence = 0
        with pytest.raises(Refused) as refused:
            await release(p.victim, p.ctx, malformed)
        assert refused.value.reason == "NOT_FOUND"


@run_async
async def test_a_release_of_a_record_near_etcds_request_limit_is_not_refused_by_its_memory(
        etcd: EtcdServer, prefix: str) -> None:
    # A record may hold ~1 MB of provider handles (256 links of up to 4,096 characters, kept across
    # grants). A fresh read's release sends it once; compared on its remembered bytes it would be
    # sent twice, past etcd's request limit (1.5 MiB), so etcd refused every such release on the
    # replica that wrote the record, however often it was retried.
    sid = "sess-remembered-5"
    async with victim_granted(etcd, prefix, sid) as (p, granted):
        entry, record = await p.victim.sessions.require(sid)
        for fence in range(1, 201):  # as earlier owners recorded them
            record.provider_handle_chain.add(handle=f"{fence:04d}" + "h" * 4092, minted_at_fence=fence)
        assert await p.victim.sessions.transition_entry(entry, record, "provider-handle") is not None
        released = await release(p.victim, p.ctx, granted.grant)
        assert released.record.lease.claim_status == pb.RELEASED
        assert len(released.record.provider_handle_chain) == 200
