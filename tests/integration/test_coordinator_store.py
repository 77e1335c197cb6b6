"""The store over a real etcd: one-transaction writes, fenced compares, races, leases, watch, outage."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.coordinator import fencing
from holdfast.coordinator.store import (
    MAX_TXN_OPS,
    Put,
    Store,
    StoreUnavailable,
    absent,
    channel_target,
    mod_equals,
    value_equals,
)
from holdfast.localstack.etcd_server import EtcdServer, free_port
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async

pytest_plugins = ["tests.integration.coordinator_fixtures"]

pytestmark = pytest.mark.timeout(60)


def test_channel_target_lists_every_endpoint() -> None:
    assert channel_target("http://127.0.0.1:1,http://127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(ValueError):
        channel_target("http://127.0.0.1")


@run_async
async def test_fenced_write_is_one_compare_on_the_fence_key(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        secret = fencing.mint_grant_secret()
        fence_key = store.key("fence", "s1")
        live = fencing.fence_value(7, pb.LIVE, fencing.hash_secret(secret))
        assert (await store.txn([absent(fence_key)], [Put(fence_key, live.encode())]))[0]
        data = store.key("data", "s1", "k")
        ok, _ = await store.txn([value_equals(fence_key, fencing.expected_fence_value(7, pb.LIVE, secret))],
                                [Put(data, b"v1")])
        assert ok
        # An old grant and a wrong secret both fail the same compare and write nothing.
        for fence, sec in ((6, secret), (7, fencing.mint_grant_secret())):
            expected = fencing.expected_fence_value(fence, pb.LIVE, sec)
            ok, _ = await store.txn([value_equals(fence_key, expected)], [Put(data, b"evil")])
            assert not ok
        entry = await store.get(data)
        assert entry is not None and entry.value == b"v1"
    finally:
        await store.close()


@run_async
async def test_32_racing_compare_and_swaps_one_wins(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        key = store.key("sessions", "race")
        await store.txn([absent(key)], [Put(key, b"0")])
        entry = await store.get(key)
        assert entry is not None
        same = [mod_equals(key, entry.mod_revision)]
        race = [store.txn(same, [Put(key, str(i).encode())]) for i in range(32)]
        results = await asyncio.gather(*race)
        assert sum(ok for ok, _ in results) == 1
    finally:
        await store.close()


@run_async
async def test_read_all_is_each_key_as_read_alone_in_one_round_trip(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        keys = [store.key("read-all", name) for name in ("b", "absent", "a")]
        await store.txn([], [Put(keys[0], b"B"), Put(keys[2], b"A")])
        await store.txn([], [Put(keys[0], b"B2")])  # a second revision of one key
        together = await store.read_all(keys)
        alone = [await store.read(key) for key in keys]
        assert together == alone  # same order, same entries (values and mod revisions), absent as None
        assert [s.entry.value if s.entry else None for s in together] == [b"B2", None, b"A"]
        assert await store.read_all([]) == []
        with pytest.raises(ValueError, match="at most"):
            await store.read_all([keys[0]] * (MAX_TXN_OPS + 1))
    finally:
        await store.close()


@run_async
async def test_paged_listing_and_watch(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        _, start = await store.snapshot_prefix(store.key("sessions", ""))
        for i in range(5):
            await store.txn([], [Put(store.key("sessions", f"s{i}"), b"x")])
        page, more = await store.list_prefix(store.key("sessions", ""), limit=2)
        assert [e.key.rsplit("/", 1)[1] for e in page] == ["s0", "s1"] and more
        page, more = await store.list_prefix(store.key("sessions", ""), start_after=page[-1].key, limit=10)
        assert [e.key.rsplit("/", 1)[1] for e in page] == ["s2", "s3", "s4"] and not more
        seen = []
        async for event in store.watch_prefix(store.key("sessions", ""), start + 1):
            seen.append(event)
            if len(seen) == 5:
                break
        assert len(seen) == 5
    finally:
        await store.close()


@run_async
async def test_lease_bound_key_is_create_only_while_live(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        key = store.key("hosts", "a")
        lease = await store.grant_lease(5)
        assert (await store.txn([absent(key)], [Put(key, b"a1", lease)]))[0]
        assert not (await store.txn([absent(key)], [Put(key, b"a2")]))[0]
        assert await store.refresh_lease(lease) > 0
        await store.revoke_lease(lease)
        assert await store.get(key) is None
        assert await store.refresh_lease(lease) == 0
    finally:
        await store.close()


@run_async
async def test_outage_is_unavailable_and_writes_nothing(tmp_path, prefix: str) -> None:
    server = EtcdServer(tmp_path / "etcd", fast_election=True, client_port=free_port()).start()
    store = Store.connect(server.url, prefix=prefix)
    try:
        server_port = server.client_port
        server.stop()
        with pytest.raises(StoreUnavailable) as written:
            await store.txn([], [Put(store.key("sessions", "x"), b"x")])
        # A transaction etcd did not answer is never said to have written nothing: from here it
        # cannot be told from one applied just before the answer was lost.
        assert written.value.outcome_unknown
        server.client_port = server_port
        server.start()
        assert await store.get(store.key("sessions", "x")) is None
    finally:
        await store.close()
        server.stop()
