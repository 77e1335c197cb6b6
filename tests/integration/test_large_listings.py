"""Listings of every session over a real etcd whose records together pass the coordinator's 16 MiB
receive limit: each is read in pages at one revision, so host recovery, drain, ListSessions and
WatchSessions still work; an answer too large to receive is never a RECORD_TOO_LARGE; and a drain
refused writes no flag; a listing whose revision etcd compacts between its pages starts again, at
one newer revision."""

from __future__ import annotations

import pytest
from aetcd import rpc

from holdfast.coordinator import records, store
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Entry, Put, Store, StoreUnavailable, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import Context, Refused, acquire, record_of, register

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(240)]
GONE = "host-gone"  # the owner's host: never registered here, so RecoverHost may free it


def handle(i: int) -> str:
    return f"{i:04d}".ljust(records.MAX_HANDLE_CHARS, "h")


async def fill(svc: CoordinatorService, copies: int, links: int) -> list[str]:
    """`copies` sessions committed to GONE, each with `links` full-size handles."""
    await register(svc, "host-seed")
    await acquire(svc, Context(), "sess-seed", "host-seed")
    record = await record_of(svc, "sess-seed")
    assert record is not None
    record.lease.claim_status = pb.COMMITTED
    record.lease.owner.host_id, record.lease.owner.pid = GONE, 4242
    for i in range(links):
        record.provider_handle_chain.add(handle=handle(i), minted_at_fence=1, observed_at_unix_ms=1)
    sids = [f"sess-big-{i:04d}" for i in range(copies)]
    per_txn = max(1, 1_000_000 // len(records.encode(record)))
    for start in range(0, copies, per_txn):
        puts = []
        for sid in sids[start:start + per_txn]:
            record.session_id = sid
            puts.append(Put(svc.store.key("sessions", sid), records.encode(record)))
        assert (await svc.store.txn([], puts))[0]
    await svc.store.txn([], [], [svc.store.key("sessions", "sess-seed")])
    return sids


@run_async
async def test_every_listing_of_sessions_past_the_receive_limit_works(etcd: EtcdServer, prefix: str) -> None:
    svc, ctx = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context()
    try:
        at_cap = records.MAX_CHAIN_BYTES // records.MAX_HANDLE_CHARS
        sids = await fill(svc, 400, at_cap)
        stored = await svc.store.get(svc.store.key("sessions", sids[0]))
        assert stored is not None and 400 * len(stored.value) > 16 << 20  # the receive limit
        assert [r.session_id for _, r in await svc.lifecycle.all_sessions()] == sids

        listed: list[str] = []
        token = ""
        while True:
            page = await svc.ListSessions(pb.ListSessionsRequest(page_size=150, page_token=token), ctx)
            listed += [r.session_id for r in page.records]
            token = page.next_page_token
            if not token:
                break
        assert listed == sids

        events = svc.WatchSessions(pb.WatchSessionsRequest(), ctx)
        watched = [(await anext(events)).record.session_id for _ in sids]
        await events.aclose()
        assert watched == sids

        drained = await svc.DrainHost(pb.DrainHostRequest(host_id=GONE, draining=True, operator="op"), ctx)
        assert list(drained.handoff_requested) == sids
        await svc.DrainHost(pb.DrainHostRequest(host_id=GONE, draining=False), ctx)
        gone = pb.RecoverHostRequest(host_id=GONE, operator="op", reason="gone")
        recovered = await svc.RecoverHost(gone, ctx)
        assert [r.session_id for r in recovered.results if r.recovered] == sids
    finally:
        await svc.store.close()


@run_async
async def test_records_from_before_the_cap_are_listed_in_smaller_pages(etcd: EtcdServer, prefix: str) -> None:
    """~800 KB records (200 handles, as a coordinator before the byte cap could leave them): a page
    of them is over the receive limit, so it is read again at half as many keys; never a
    RECORD_TOO_LARGE, which would blame a session for the listing's size."""
    svc = CoordinatorService(Store(open_channel(etcd.url), prefix))
    try:
        sids = await fill(svc, 24, 200)
        assert [r.session_id for _, r in await svc.lifecycle.all_sessions()] == sids
    finally:
        await svc.store.close()


@run_async
async def test_a_streamed_listing_reads_pages_of_bounded_bytes_and_small_records_in_full_pages(
    etcd: EtcdServer, prefix: str
) -> None:
    """A WatchSessions listing is read a page at a time and its reader may stop between pages (a
    stalled caller), keeping that page: pages of records at the cap stay within PAGE_BYTES (a page
    of PAGE keys of them was ~7.5 MiB, counted by no limit), every record listed once, in order, at
    one revision; small records still come PAGE to a Range once the first pages have grown."""
    svc = CoordinatorService(Store(open_channel(etcd.url), prefix))
    try:
        sids = await fill(svc, 160, records.MAX_CHAIN_BYTES // records.MAX_HANDLE_CHARS)
        sizes, listed, revisions = [], [], set()
        async for page, revision in svc.store.snapshot_pages(svc.store.key("sessions", "")):
            sizes.append(sum(len(e.key) + len(e.value) for e in page))
            listed += [e.key.rsplit("/", 1)[1] for e in page]
            revisions.add(revision)
        assert listed == sids and len(revisions) == 1
        assert max(sizes) <= store.PAGE_BYTES, sizes

        small = [Put(svc.store.key("small", f"k{i:04d}"), b"v" * 100) for i in range(600)]
        for at in range(0, len(small), 100):
            assert (await svc.store.txn([], small[at:at + 100]))[0]
        counts = [len(page) async for page, _ in svc.store.snapshot_pages(svc.store.key("small", ""))]
        assert sum(counts) == 600 and counts[:8] == [3, 6, 12, 24, 48, 96, 117, 117], counts
    finally:
        await svc.store.close()


class SessionsUnreadable(Store):
    """A store whose every listing of the sessions fails as an outage."""

    async def list_prefix(self, prefix: str, start_after: str = "",
                          limit: int = 0) -> tuple[list[Entry], bool]:
        if prefix.endswith("/sessions/"):
            raise StoreUnavailable("etcd: listing refused by the test")
        return await super().list_prefix(prefix, start_after, limit)


@run_async
async def test_a_drain_refused_writes_no_flag(etcd: EtcdServer, prefix: str) -> None:
    svc, ctx = CoordinatorService(SessionsUnreadable(open_channel(etcd.url), prefix)), Context()
    try:
        await register(svc, "host-drained")
        drain = pb.DrainHostRequest(host_id="host-drained", draining=True, operator="op")
        with pytest.raises(Refused) as refused:
            await svc.DrainHost(drain, ctx)
        assert refused.value.reason == "UNAVAILABLE" and "nothing was written" in str(refused.value)
        assert await svc.lifecycle.draining_hosts() == []
    finally:
        await svc.store.close()


class CompactedBetweenPages(Store):
    """Before the second page of its first listing, one more key is written and etcd compacted past
    the revision the first page was read at."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.compacted_at = 0
        self.first_pages = 0  # Ranges at the newest revision: one per start of a listing

    async def _call(self, method, request):  # type: ignore[no-untyped-def]
        if isinstance(request, rpc.RangeRequest) and request.range_end:
            if not request.revision:
                self.first_pages += 1
            elif not self.compacted_at:
                _, self.compacted_at = await self.txn([], [Put(self.key("listed", "k-late"), b"late")])
                await rpc.KVStub(self.channel).Compact(
                    rpc.CompactionRequest(revision=self.compacted_at, physical=True))
        return await super()._call(method, request)


@run_async
async def test_a_listing_compacted_between_its_pages_lists_again_at_one_newer_revision(
        etcd: EtcdServer, prefix: str) -> None:
    """Pages after the first are read at the first's revision, so the listing is one snapshot; etcd
    compacting that revision meanwhile must not fail it (nor return pages of two revisions): it
    lists again from the start, at a revision that has the key written meanwhile."""
    db = CompactedBetweenPages(open_channel(etcd.url), prefix)
    try:
        keys = [db.key("listed", f"k-{i:04d}") for i in range(2 * store.PAGE + 3)]
        for start in range(0, len(keys), 100):
            assert (await db.txn([], [Put(k, b"v") for k in keys[start:start + 100]]))[0]
        entries, revision = await db.snapshot_prefix(db.key("listed", ""))
        assert db.compacted_at and db.first_pages == 2
        assert [e.key for e in entries] == [*keys, db.key("listed", "k-late")]
        assert revision >= db.compacted_at
    finally:
        await db.close()
