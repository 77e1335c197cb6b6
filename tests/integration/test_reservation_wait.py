"""A waiting Acquire on a reservation waits out its wait and answers RESERVED, also when etcd has
compacted the reservation's revision away: a compacted watch start is no change of the record (the
record is read again and watched on), and a wait is no lost race. Real etcd; the reserved host's
agent is unreachable, so the reservation is neither committed nor proven unused."""

from __future__ import annotations

import asyncio
import time

import pytest
from aetcd import rpc

from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from tests.integration.coordinator_fixtures import run_async
from tests.integration.test_record_size import everything
from tests.integration.txn_harness import Context, Refused, acquire, register

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
WAIT_S = 3


@pytest.mark.parametrize("compacted", [False, True])
@run_async
async def test_a_waiter_on_a_reservation_answers_reserved_after_its_wait(
        etcd: EtcdServer, prefix: str, compacted: bool) -> None:
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-wait-reserved"
    try:
        await register(svc, "host-a")
        await register(svc, "host-b")
        await acquire(svc, ctx, sid, "host-a")  # a reservation no agent will commit or answer for
        if compacted:
            for value in (b"1", b"2"):  # the watch's start, just past the reservation, compacted too
                _, now = await svc.store.txn([], [Put(svc.store.key("unrelated"), value)])
            await rpc.KVStub(svc.store.channel).Compact(rpc.CompactionRequest(revision=now, physical=True))
        before = await everything(svc.store)
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            await acquire(svc, ctx, sid, "host-b", wait_seconds=WAIT_S)
        waited = time.monotonic() - started
        assert refused.value.reason == "RESERVED", str(refused.value)
        assert waited >= WAIT_S, f"answered after {waited:.2f} s of a {WAIT_S} s wait"
        assert await everything(svc.store) == before, "a refused waiter wrote nothing"
    finally:
        await svc.store.close()


@run_async
async def test_a_wait_from_a_compacted_revision_misses_no_change_of_the_record(
        etcd: EtcdServer, prefix: str) -> None:
    svc, ctx, sid = CoordinatorService(Store(open_channel(etcd.url), prefix)), Context(), "sess-wait-change"
    try:
        await register(svc, "host-a")
        await acquire(svc, ctx, sid, "host-a")
        key = svc.sessions.key(sid)
        reserved = await svc.store.get(key)
        assert reserved is not None
        for value in (b"1", b"2"):
            _, now = await svc.store.txn([], [Put(svc.store.key("unrelated"), value)])
        await rpc.KVStub(svc.store.channel).Compact(rpc.CompactionRequest(revision=now, physical=True))
        started = time.monotonic()
        waiting = asyncio.ensure_future(svc.sessions.changed(key, reserved.mod_revision, 30))
        await svc.store.txn([], [Put(key, reserved.value)])  # the record changes (a commit, a release)
        await waiting
        assert time.monotonic() - started < 15, "the record's change ended the wait"
    finally:
        await svc.store.close()
