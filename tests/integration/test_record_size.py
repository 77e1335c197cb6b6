"""A session record stays within what etcd takes, over a real etcd: the provider handle chain is
capped in bytes (CHAIN_FULL, nothing written), and a record grown past etcd's request limit before
that cap is refused by a typed RECORD_TOO_LARGE that writes nothing, never UNKNOWN, and can be
archived."""

from __future__ import annotations

import pytest

from holdfast.coordinator import records
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import Context, Refused, acquire, archive, record_of, register, release

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
HOST = "host-size"


def handle(i: int) -> str:
    return f"{i:04d}".ljust(records.MAX_HANDLE_CHARS, "h")  # a full-size handle


async def everything(store: Store) -> list[tuple[str, bytes]]:
    entries, _ = await store.list_prefix(store.prefix)
    return [(e.key, e.value) for e in entries]


async def put_record(store: Store, record: pb.SessionRecord) -> None:
    """The record written straight into etcd, as a coordinator before the byte cap could leave it."""
    assert (await store.txn([], [Put(store.key("sessions", record.session_id), records.encode(record))]))[0]


async def released_with_chain(svc: CoordinatorService, ctx: Context, sid: str,
                              links: int) -> pb.SessionRecord:
    """`sid` granted and released on HOST, then `links` full-size handles put straight into its
    record: as a coordinator from before the byte cap could leave it."""
    await register(svc, HOST)
    await release(svc, ctx, (await acquire(svc, ctx, sid, HOST)).grant)
    record = await record_of(svc, sid)
    assert record is not None
    for i in range(links):
        record.provider_handle_chain.add(handle=handle(i), minted_at_fence=1, observed_at_unix_ms=1)
    await put_record(svc.store, record)
    return record

@run_async
async def test_a_chain_at_its_byte_cap_refuses_the_next_handle_and_writes_nothing(
        etcd: EtcdServer, prefix: str) -> None:
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-chain-bytes"
    try:
        await register(svc, HOST)
        grant = (await acquire(svc, ctx, sid, HOST)).grant
        record = await record_of(svc, sid)
        assert record is not None
        record.lease.claim_status = pb.COMMITTED  # as CommitOwner leaves it (no agent here)
        await put_record(svc.store, record)
        written = 0
        for i in range(records.MAX_CHAIN_BYTES // records.MAX_HANDLE_CHARS + 1):
            request = pb.RecordProviderHandleRequest(session_id=sid, fence=grant.fence, secret=grant.secret,
                                                     handle=handle(i))
            before = await everything(svc.store)
            try:
                await svc.RecordProviderHandle(request, ctx)
            except Refused as refused:
                assert refused.reason == "CHAIN_FULL" and str(records.MAX_CHAIN_BYTES) in str(refused)
                assert await everything(svc.store) == before, "a refused handle wrote nothing"
                break
            written += 1
        else:
            pytest.fail(f"{written} full-size handles taken: the chain's bytes are not capped")
        stored = await svc.store.get(svc.store.key("sessions", sid))
        assert stored is not None
        chain = records.decode_record(stored.value).provider_handle_chain
        assert len(chain) == written and records.chain_bytes(chain) <= records.MAX_CHAIN_BYTES
        # The grant's transaction carries the record twice (record and replay copy): a quarter of
        # etcd's request limit holds both, with room to spare.
        assert 2 * len(stored.value) < records.ETCD_REQUEST_LIMIT_BYTES // 4
    finally:
        await svc.store.close()


# 200 full-size links: the grant's request passes etcd's --max-request-bytes ("request is too
# large"); 256: it passes etcd's gRPC message limit too (RESOURCE_EXHAUSTED).
@pytest.mark.parametrize("links", [200, 256])
@run_async
async def test_an_oversized_record_refuses_every_acquire_typed_and_is_archived(
        etcd: EtcdServer, prefix: str, links: int) -> None:
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-oversized"
    try:
        record = await released_with_chain(svc, ctx, sid, links)
        before = await everything(svc.store)
        for kind in ({}, {"wait_seconds": 2}, {"takeover": True}, {"takeover": True, "force": True}):
            with pytest.raises(Refused) as refused:
                await acquire(svc, ctx, sid, HOST, **kind)
            assert refused.value.reason == "RECORD_TOO_LARGE", (kind, str(refused.value))
            assert await everything(svc.store) == before, f"a refused Acquire {kind} wrote nothing"
        archived = await archive(svc, ctx, sid, record.lease.fence)
        assert len(archived.record.provider_handle_chain) == links
        assert await record_of(svc, sid) is None
        again = await acquire(svc, ctx, sid, HOST)
        assert again.grant.fence == record.lease.fence + 1 and not again.record.provider_handle_chain
    finally:
        await svc.store.close()


@run_async
async def test_a_takeover_of_an_owner_whose_record_is_oversized_asks_kills_and_writes_nothing(
        etcd: EtcdServer, prefix: str) -> None:
    """A grant that etcd would refuse by its size is refused before the takeover asks the owner to
    end (handoff-requested) or a forced one writes force-pending and kills: RECORD_TOO_LARGE, with
    nothing written (the owner's host has no agent here: any probe or kill would be tried on it)."""
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-big-owner"
    try:
        await register(svc, HOST)
        await register(svc, "host-taker")
        await acquire(svc, ctx, sid, HOST)
        record = await record_of(svc, sid)
        assert record is not None
        record.lease.claim_status = pb.COMMITTED  # a live owner, as CommitOwner leaves it
        record.lease.owner.host_id, record.lease.owner.pid = HOST, 4242
        for i in range(200):
            record.provider_handle_chain.add(handle=handle(i), minted_at_fence=1, observed_at_unix_ms=1)
        await put_record(svc.store, record)
        before = await everything(svc.store)
        for kind in ({"takeover": True, "wait_seconds": 2}, {"takeover": True, "force": True}):
            with pytest.raises(Refused) as refused:
                await acquire(svc, ctx, sid, "host-taker", **kind)
            assert refused.value.reason == "RECORD_TOO_LARGE", (kind, str(refused.value))
            assert await everything(svc.store) == before, f"a refused Acquire {kind} asked or wrote nothing"
    finally:
        await svc.store.close()


@run_async
async def test_a_record_a_grant_carries_twice_within_etcds_limit_is_granted_with_its_chain(
        etcd: EtcdServer, prefix: str) -> None:
    """A record from before the byte cap of ~540 KB: three copies would pass etcd's request limit,
    but a grant on a fresh read carries it twice (a record that large is never remembered), and etcd
    takes it. Granted, its chain kept for the next owner to resume from."""
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-large-fits"
    try:
        record = await released_with_chain(svc, ctx, sid, 130)
        size = len(records.encode(record))
        assert not records.grant_fits(size, remembered=True) and records.grant_fits(size, remembered=False)
        granted = await acquire(svc, ctx, sid, HOST)
        assert granted.grant.fence == record.lease.fence + 1
        assert len(granted.record.provider_handle_chain) == 130
    finally:
        await svc.store.close()
