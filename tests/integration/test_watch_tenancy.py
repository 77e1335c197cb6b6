"""WatchSessions of every session across tenants, over a real etcd: a deletion is shown only to the
tenant whose record it deleted, also when the id is used again by another tenant and when the
shared watch has forgotten the key's tag; a deletion is said once, not again at a re-listing; and a
record the shared watch cannot tag (bytes nested past Python's recursion limit) fails only the calls
that read it, never an owner's watch of its own record."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from holdfast.coordinator import keys, records, watch_fanout
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Entry, Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.test_call_limits import Peer, pems  # noqa: F401
from tests.integration.test_watch_hub import wait_until
from tests.integration.txn_harness import Context

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)


async def put(service: CoordinatorService, sid: str, tenant: str = "", raw: bytes | None = None,
              handles: int = 0) -> int:
    record = pb.SessionRecord(session_id=sid, schema_version=1, tenant=tenant)
    for _ in range(handles):
        record.provider_handle_chain.add(handle="h" * 250, minted_at_fence=1)
    ok, revision = await service.store.txn([], [Put(keys.session(service.store, sid),
                                                    raw if raw is not None else records.encode(record))])
    assert ok
    return revision


async def delete(service: CoordinatorService, sid: str) -> None:
    assert (await service.store.txn([], [], [keys.session(service.store, sid)]))[0]


async def until_done(call: AsyncIterator[pb.SessionEvent], last: str) -> list[tuple[str, bool]]:
    """(id, deleted) of every event up to and including `last`'s record."""
    got = []
    while not got or got[-1] != (last, False):
        event = await anext(call)
        got.append((event.record.session_id, event.deleted))
    return got


async def reuse(service: CoordinatorService) -> None:
    """Team a's `x` deleted (archived), the id then taken and deleted by team b, then a change of
    team a's that ends what team a's call is to see."""
    await delete(service, "x")
    await put(service, "x", "team-b")
    await put(service, "pad", "team-c")  # another key put since: with one tag remembered, x's goes
    await delete(service, "x")
    await put(service, "a-done", "team-a")


@pytest.mark.parametrize("served", [False, True], ids=["own-watch", "served-tag-forgotten"])
@run_async
async def test_another_tenants_deletion_of_an_id_used_again_is_not_shown(
    etcd: EtcdServer, prefix: str, pems: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    served: bool,
) -> None:
    monkeypatch.setattr(watch_fanout, "REMEMBERED_TAGS", 1)
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    first = service.WatchSessions(pb.WatchSessionsRequest(), Context())
    try:
        if served:  # the replica's shared watch opened first, so team a's call is served from it
            opened = asyncio.ensure_future(anext(first))
            await wait_until(lambda: service.store.watch_creates == 2, "the shared watch open")
            await put(service, "x", "team-a")
            assert (await opened).record.session_id == "x"
        else:
            await put(service, "x", "team-a")
        call = service.WatchSessions(pb.WatchSessionsRequest(), Peer(pems["team-a"], "ipv4:127.0.0.1:41001"))
        try:
            assert (await anext(call)).record.session_id == "x"
            creates = service.store.watch_creates
            await reuse(service)
            assert await until_done(call, "a-done") == [("x", True), ("a-done", False)]
            assert (service.store.watch_creates == creates) is served
        finally:
            await call.aclose()
    finally:
        await first.aclose()
        await service.store.close()


@run_async
async def test_a_deletion_said_live_is_not_said_again_at_a_relisting(etcd: EtcdServer, prefix: str) -> None:
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    budget = service.store.watch_budget
    budget.limit = 16 * 1024
    await put(service, "gone")
    await put(service, "kept")
    call = service.WatchSessions(pb.WatchSessionsRequest(), Context())
    try:
        assert [(await anext(call)).record.session_id for _ in range(2)] == ["gone", "kept"]
        reading = asyncio.ensure_future(anext(call))
        await delete(service, "gone")
        assert ((event := await reading).record.session_id, event.deleted) == ("gone", True)
        for i in range(3):  # unread, past the budget: the call's watch ends and it lists again
            await put(service, f"large-{i}", handles=27)
        await wait_until(lambda: budget.shed == 1, "the budget ends the stalled watch")
        await put(service, "zz-last")
        said = await until_done(call, "zz-last")  # the re-listing's records, then what it says deleted
        await put(service, "zz-after")  # a change on the watch after the re-listing, past all of it
        said += await until_done(call, "zz-after")
        assert [sid for sid, deleted in said if deleted] == [], said
    finally:
        await call.aclose()
        await service.store.close()


@run_async
async def test_a_record_nothing_can_tag_fails_only_the_calls_that_read_it(
    etcd: EtcdServer, prefix: str, pems: dict[str, bytes]  # noqa: F811
) -> None:
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    first = service.WatchSessions(pb.WatchSessionsRequest(), Context())
    opened = asyncio.ensure_future(anext(first))
    await wait_until(lambda: service.store.watch_creates == 2, "the shared watch open")
    revision = await put(service, "owned", "team-a")
    assert (await opened).record.session_id == "owned"
    tagged = service.WatchSessions(pb.WatchSessionsRequest(), Peer(pems["team-a"], "ipv4:127.0.0.1:41003"))
    owner = service.store.watch_key(keys.session(service.store, "owned"), revision + 1, revision)
    try:
        assert (await anext(tagged)).record.session_id == "owned"
        live = asyncio.ensure_future(anext(tagged))  # read on: its watch joins the shared one, tagged
        await put(service, "a-live", "team-a")
        assert (await live).record.session_id == "a-live"
        reading = asyncio.ensure_future(anext(owner))
        await put(service, "bad", raw=b"[" * 5000)  # another session's record, nested past the limit
        again = await put(service, "owned", "team-a")
        change = await reading  # the owner's watch goes on, past the record it never reads
        assert isinstance(change, Entry) and change.mod_revision == again
        with pytest.raises(RecursionError):  # a call that reads the record fails on it, alone
            while True:
                await anext(tagged)
    finally:
        await tagged.aclose()
        await owner.aclose()
        await first.aclose()
        await service.store.close()
