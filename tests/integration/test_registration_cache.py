"""The registration cache (`Registry.follow`) over a real etcd: decisions read registrations from
it without a round trip, and a cached registration that is no longer current can only make a
decision's transaction lose, never let it through."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from holdfast.coordinator import registry as registry_
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.store import Entry, Put, Seen, Store, open_channel, unchanged
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)


class HeldWatch(Store):
    """A store whose watch delivers nothing until `release` is set, so the cache lags etcd (as it
    may for a moment in production), and which counts the reads that reach etcd."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(open_channel(url), prefix)
        self.release = asyncio.Event()
        self.reads = 0

    async def read(self, key: str) -> Seen:
        self.reads += 1
        return await super().read(key)

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[Entry | str]:
        await self.release.wait()
        async for change in super().watch_prefix(prefix, start_revision):
            yield change


def registration(host_id: str, address: str) -> pb.HostRegistration:
    return pb.HostRegistration(host_id=host_id, address=address, spawn_token_env="HOLDFAST_SPAWN_TOKEN")


@run_async
async def test_a_lagging_cache_makes_decisions_lose_and_never_hides_a_host(
    etcd: EtcdServer, prefix: str
) -> None:
    store = HeldWatch(etcd.url, prefix)
    registry = Registry(store)
    await registry.register(registration("host-c1", "127.0.0.1:1"), 60)
    follow = asyncio.create_task(registry.follow())
    try:
        await asyncio.wait_for(registry.following.wait(), 10)
        first = await registry.seen("host-c1")
        assert store.reads == 0, "a registration listed when the cache started is served from it"
        assert registry_.decode(first).address == "127.0.0.1:1"  # type: ignore[union-attr]

        # The host re-registers behind the cache's back (its agent restarted elsewhere).
        await store.txn([], [], deletes=[first.key])
        await registry.register(registration("host-c1", "127.0.0.1:2"), 60)
        stale = await registry.seen("host-c1")
        assert stale.entry == first.entry, "the watch is held: the cache still holds the old registration"
        decision = store.key("decision-on-a-stale-registration")
        ok, _ = await store.txn(unchanged([stale]), [Put(decision, b"granted")])
        assert not ok and await store.get(decision) is None

        # A host the cache does not hold is read from etcd: a refusal never rests on a lagging watch.
        await registry.register(registration("host-c2", "127.0.0.1:3"), 60)
        assert registry_.decode(await registry.seen("host-c2")) is not None and store.reads == 1

        store.release.set()
        deadline = time.monotonic() + 10
        while registry_.decode(await registry.seen("host-c1")).address != "127.0.0.1:2":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the cache never caught up with the watch"
            await asyncio.sleep(0.01)
        current = await registry.seen("host-c1")
        ok, _ = await store.txn(unchanged([current]), [Put(decision, b"granted")])
        assert ok, "a current cached registration compares equal in the decision's transaction"
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        await store.close()
