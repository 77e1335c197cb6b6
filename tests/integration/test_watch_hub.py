"""The store's shared etcd watch stream (coordinator/watch_hub.py) over a real etcd: many watchers on
one stream, each with exactly its own events in order; a watcher's end, a compaction and a slow
reader touch that watcher alone; a killed etcd is an error to every watcher, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import urllib.request
from collections.abc import AsyncIterator

import pytest
from aetcd import rpc

from holdfast.coordinator import watch_hub
from holdfast.coordinator.store import Compacted, Entry, Put, Store, StoreUnavailable
from holdfast.coordinator.store_errors import Lagged, Unreached
from holdfast.localstack.etcd_server import EtcdServer
from tests.integration.coordinator_fixtures import run_async

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)


def watch_streams(etcd: EtcdServer) -> tuple[int, int]:
    """(Watch streams etcd has opened, and ended), from its own /metrics."""
    counts = {"started": 0, "handled": 0}
    with urllib.request.urlopen(f"{etcd.url}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            for kind in counts:
                if line.startswith(f"grpc_server_{kind}_total{{") and 'grpc_method="Watch"' in line:
                    counts[kind] += int(float(line.rsplit(" ", 1)[1]))
    return counts["started"], counts["handled"]


def etcd_watchers(etcd: EtcdServer) -> int:
    """The watches etcd holds, from its own /metrics."""
    with urllib.request.urlopen(f"{etcd.url}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("etcd reports no watcher count")


async def take(changes: AsyncIterator[Entry | str], n: int) -> list[str]:
    """The next n changes, each as `key=value` (a put) or `key` (a delete)."""
    out = []
    async for change in changes:
        out.append(change if isinstance(change, str) else f"{change.key}={change.value.decode()}")
        if len(out) == n:
            break
    return out


async def revision(store: Store) -> int:
    return (await store.snapshot_prefix(store.key("none")))[1]


@run_async
async def test_many_watchers_share_one_stream_each_with_exactly_its_events_in_order(
    etcd: EtcdServer, prefix: str
) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        opened, _ = watch_streams(etcd)
        # 24 watchers: one per key prefix p00..p23, and each of p00..p07 watched twice more.
        names = [f"p{i:02d}" for i in range(24)] + [f"p{i:02d}" for i in range(8)] * 2
        watchers = [store.watch_prefix(store.key(name, ""), start) for name in names]
        expected: dict[str, list[str]] = {name: [] for name in names}

        async def write(puts: list[Put], deletes: tuple[str, ...] = ()) -> None:
            await store.txn([], puts, deletes=list(deletes))
            for put in puts:
                expected[put.key.split("/")[-2]].append(f"{put.key}={put.value.decode()}")
            for key in deletes:
                expected[key.split("/")[-2]].append(key)

        for r in range(5):
            # Keys of two watchers' prefixes in one transaction, a third's alone, and deletes.
            for i in range(0, 24, 3):
                await write([Put(store.key(f"p{j:02d}", f"k{r}"), f"{j}.{r}".encode()) for j in (i, i + 1)])
                await write([Put(store.key(f"p{i + 2:02d}", "k"), f"{r}".encode())])
            await write([], (store.key("p04", f"k{r}"), store.key("p06", f"k{r}")))
        got = await asyncio.gather(*(take(w, len(expected[name]))
                                     for w, name in zip(watchers, names, strict=True)))
        for name, changes in zip(names, got, strict=True):
            assert changes == expected[name], name
        # Nothing more than its own: the next change each one sees is the next one of its prefix.
        for name in sorted(set(names)):
            await store.txn([], [Put(store.key(name, "last"), b"x")])
        nexts = await asyncio.gather(*(take(w, 1) for w in watchers))
        assert nexts == [[f"{store.key(name, 'last')}=x"] for name in names]
        assert watch_streams(etcd)[0] == opened + 1, "every watcher rode one etcd Watch stream"
        for w in watchers:
            await w.aclose()
    finally:
        await store.close()


@run_async
async def test_a_watcher_that_ends_leaves_the_others_and_the_last_closes_the_stream(
    etcd: EtcdServer, prefix: str
) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        opened, ended = watch_streams(etcd)
        key = store.key("shared", "k")
        watchers = [store.watch_prefix(store.key("shared", ""), start) for _ in range(3)]
        await store.txn([], [Put(key, b"1")])
        assert await asyncio.gather(*(take(w, 1) for w in watchers)) == [[f"{key}=1"]] * 3
        await watchers[1].aclose()  # its cancel goes on the shared stream; the others stay
        for value in (b"2", b"3"):
            await store.txn([], [Put(key, value)])
        for w in (watchers[0], watchers[2]):
            assert await take(w, 2) == [f"{key}=2", f"{key}=3"]
        # A watcher that ends before etcd has answered its create: its id is cancelled when it comes.
        early = store.watch_prefix(store.key("shared", ""), start)
        reading = asyncio.ensure_future(early.__anext__())
        await asyncio.sleep(0)  # its create is queued; etcd has not answered it yet
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await store.txn([], [Put(key, b"4")])
        for w in (watchers[0], watchers[2]):
            assert await take(w, 1) == [f"{key}=4"]
        assert watch_streams(etcd)[0] == opened + 1
        await watchers[0].aclose()
        await watchers[2].aclose()
        await wait_until(lambda: watch_streams(etcd)[1] == ended + 1,
                         "the last watcher's end closes the stream")
    finally:
        await store.close()


async def wait_until(condition: object, what: str, seconds: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), seconds)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


@run_async
async def test_a_compacted_start_ends_that_watcher_alone(etcd: EtcdServer, prefix: str) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        key = store.key("c", "k")
        old = await revision(store)
        await store.txn([], [Put(key, b"1")])
        await store.txn([], [Put(key, b"2")])
        now = await revision(store)
        steady = store.watch_prefix(store.key("c", ""), now + 1)
        await store.txn([], [Put(key, b"3")])
        assert await take(steady, 1) == [f"{key}=3"]
        await rpc.KVStub(store.channel).Compact(rpc.CompactionRequest(revision=now, physical=True))
        with pytest.raises(Compacted) as ended:
            await take(store.watch_prefix(store.key("c", ""), old), 1)
        assert not isinstance(ended.value, Lagged)
        await store.txn([], [Put(key, b"4")])
        assert await take(steady, 1) == [f"{key}=4"], "the other watcher on the stream goes on"
        await steady.aclose()
    finally:
        await store.close()


@run_async
async def test_a_watch_whose_create_cannot_be_built_leaves_the_streams_routing_alone(
    etcd: EtcdServer, prefix: str
) -> None:
    """A start revision past int64 (a caller's after_revision at its top) fails that watch alone:
    a watcher queued without its create would take the next watcher's `created` answer, and every
    watcher after it the one after its own — an owner's events going to another's watch."""
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        first = store.watch_prefix(store.key("o1", ""), start)  # opens the stream
        await store.txn([], [Put(store.key("o1", "k"), b"1")])
        assert await take(first, 1) == [f"{store.key('o1', 'k')}=1"]
        with pytest.raises(ValueError):
            await take(store.watch_prefix(store.key("bad", ""), 2**63), 1)
        second = store.watch_prefix(store.key("o2", ""), start)
        third = store.watch_prefix(store.key("o3", ""), start)
        await store.txn([], [Put(store.key("o2", "k"), b"2"), Put(store.key("o3", "k"), b"3")])
        got = await asyncio.wait_for(asyncio.gather(take(second, 1), take(third, 1)), 10)
        assert got == [[f"{store.key('o2', 'k')}=2"], [f"{store.key('o3', 'k')}=3"]]
        for watcher in (first, second, third):
            await watcher.aclose()
    finally:
        await store.close()


@run_async
async def test_a_revision_etcd_has_not_reached_ends_that_watcher_unreached(etcd: EtcdServer,
                                                                            prefix: str) -> None:
    """A caller's revision past etcd's own (another history's: a snapshot restored below it) is not
    waited for: etcd would send its own history's changes there as if they followed it."""
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        now = await revision(store)
        steady = store.watch_prefix(store.key("u", ""), now + 1, now)  # reached: watched as asked
        with pytest.raises(Unreached):
            await take(store.watch_prefix(store.key("u", ""), now + 100, now + 99), 1)
        key = store.key("u", "k")
        await store.txn([], [Put(key, b"1")])
        assert await take(steady, 1) == [f"{key}=1"], "the other watcher on the stream goes on"
        await steady.aclose()
    finally:
        await store.close()


async def slow_ends_lagged_alone(store: Store, key: str, slow: AsyncIterator[Entry | str],
                                 fast: AsyncIterator[Entry | str], pad: int = 1) -> None:
    """With MAX_BEHIND 5 (or MAX_BEHIND_BYTES those of 5 events), `slow` having read `key`'s event 0
    and no more, `fast` reading each of 7 more as it comes (values of `pad` bytes): `slow` ends
    Lagged after the 6 it held, in order, and `fast` goes on."""
    fast_seen = []
    for i in range(1, 8):
        await store.txn([], [Put(key, str(i).encode() * pad)])
        fast_seen += await take(fast, 1)
    assert fast_seen == [f"{key}={str(i) * pad}" for i in range(1, 8)]
    got = []
    with pytest.raises(Lagged):
        async for change in slow:
            assert isinstance(change, Entry)
            got.append(change.value.decode())
    # The events it held when it passed its bound, in order, then the error.
    assert got == [str(i) * pad for i in range(1, 7)], got
    await store.txn([], [Put(key, b"after")])
    assert await take(fast, 1) == [f"{key}=after"]


@run_async
async def test_a_reader_that_falls_behind_ends_lagged_after_its_events(
    etcd: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_hub, "MAX_BEHIND", 5)
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        key = store.key("l", "k")
        slow = store.watch_prefix(store.key("l", ""), start)
        fast = store.watch_prefix(store.key("l", ""), start)
        await store.txn([], [Put(key, b"0")])
        assert await take(slow, 1) == [f"{key}=0"]  # then it reads no more for a while
        assert await take(fast, 1) == [f"{key}=0"]
        await slow_ends_lagged_alone(store, key, slow, fast)
        await fast.aclose()
    finally:
        await store.close()


@run_async
async def test_a_reader_behind_by_many_bytes_ends_lagged_after_its_events(
    etcd: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded by bytes as well as by count: a reader stalled behind a few large records ends
    Lagged once the ones it holds pass MAX_BEHIND_BYTES, however few they are."""
    store = Store.connect(etcd.url, prefix=prefix)
    key, pad = store.key("b", "k"), 1000
    monkeypatch.setattr(watch_hub, "MAX_BEHIND_BYTES", 5 * (len(key) + pad))
    try:
        start = await revision(store) + 1
        slow = store.watch_prefix(store.key("b", ""), start)
        fast = store.watch_prefix(store.key("b", ""), start)
        await store.txn([], [Put(key, b"0" * pad)])
        assert await take(slow, 1) == [f"{key}={'0' * pad}"]  # taken: no longer counted against it
        assert await take(fast, 1) == [f"{key}={'0' * pad}"]
        await slow_ends_lagged_alone(store, key, slow, fast, pad)
        await fast.aclose()
    finally:
        await store.close()


async def killed_under(server: EtcdServer, watchers: list[AsyncIterator[Entry | str]]) -> None:
    """etcd killed while each of `watchers` waits for its next change: each ends StoreUnavailable,
    never in silence; then etcd is started again."""
    waiting = [asyncio.ensure_future(take(w, 1)) for w in watchers]
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 20)
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    server.start()


@run_async
async def test_a_killed_etcd_is_an_error_to_every_watcher_and_the_next_watch_opens_a_stream(
    tmp_path, prefix: str
) -> None:
    server = EtcdServer(tmp_path / "etcd", fast_election=True).start()
    store = Store.connect(server.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        key = store.key("k", "x")
        watchers = [store.watch_prefix(store.key("k", ""), start) for _ in range(5)]
        await store.txn([], [Put(key, b"1")])
        assert await asyncio.gather(*(take(w, 1) for w in watchers)) == [[f"{key}=1"]] * 5
        await killed_under(server, watchers)
        await revision(store)  # the channel is connected again (a read waits for it; a watch does not)
        after = store.watch_prefix(store.key("k", ""), start)
        assert await take(after, 1) == [f"{key}=1"]
        await after.aclose()
    finally:
        await store.close()
        server.stop()


@run_async
async def test_a_watcher_behind_by_many_large_events_gets_them_all_and_the_stream_stands(
    etcd: EtcdServer, prefix: str
) -> None:
    """A watch from before 300 records of ~63 KB: etcd sends its catch-up of up to 1,000 revisions as
    one response, 19 MB here, past the channel's 16 MiB receive limit; unfragmented, that failed
    the stream and every watcher on it. Fragmented (each part up to ~2 MiB here: 33 records, so
    mostly ending inside a revision of 4), the watcher gets every event, in order, once, and a
    bystander on the same stream goes on."""
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        start = await revision(store) + 1
        bystander = store.watch_prefix(store.key("other", ""), start)
        standing = asyncio.ensure_future(take(bystander, 1))
        big = [store.key("big", f"k{i % 7}") for i in range(300)]
        for i in range(0, len(big), 4):
            await store.txn([], [Put(big[j], f"{j:04d}".encode() + b"x" * 63_000) for j in range(i, i + 4)])
        behind = store.watch_prefix(store.key("big", ""), start)
        got = []
        async for change in behind:
            assert isinstance(change, Entry)
            got.append((change.key, change.value[:4].decode()))
            if len(got) == len(big):
                break
        assert got == [(k, f"{i:04d}") for i, k in enumerate(big)]
        await store.txn([], [Put(store.key("other", "k"), b"1")])
        assert await standing == [f"{store.key('other', 'k')}=1"], "the stream stood"
        await store.txn([], [Put(big[0], b"after")])
        assert await take(behind, 1) == [f"{big[0]}=after"], "nothing twice, nothing more"
        await behind.aclose()
        await bystander.aclose()
    finally:
        await store.close()


@run_async
async def test_stalled_readers_stay_within_the_replicas_budget_the_longest_stalled_dropping_its_events(
    etcd: EtcdServer, prefix: str
) -> None:
    """Two readers that stopped reading, each well within MAX_BEHIND_BYTES, on a store whose budget is
    10 events' bytes: once they and a reader keeping up hold more together, the one stalled longest
    (it stopped first) ends Lagged at once, holding nothing (its events dropped, not handed on
    before the error), and the other two go on with every event. Nothing stays counted once every
    reader is done."""
    pad = 1000
    store = Store.connect(etcd.url, prefix=prefix)
    key = store.key("l", "k")
    size = len(key) + pad
    budget = store.watch_budget
    budget.limit = 10 * size  # as Store.connect(..., unread_budget=) sets it
    try:
        start = await revision(store) + 1
        first, second, keeping_up = (store.watch_prefix(store.key("l", ""), start) for _ in range(3))

        async def put(i: int, *readers: AsyncIterator[Entry | str]) -> None:
            await store.txn([], [Put(key, str(i).encode() * pad)])
            for reader in readers:
                assert await take(reader, 1) == [f"{key}={str(i) * pad}"]

        await put(0, first, second, keeping_up)  # `first` reads no more
        for i in range(1, 4):
            await put(i, second, keeping_up)  # then `second` reads no more
        for i in range(4, 7):
            await put(i, keeping_up)
        # 6 and 3 held: 9 events' bytes, within the budget.
        await wait_until(lambda: budget.unread == 9 * size, "the stalled readers hold 6 and 3 events")
        assert budget.shed == 0
        watching = etcd_watchers(etcd)
        await put(7, keeping_up)  # 7 and 4 (and keeping_up's 1): past the budget
        await wait_until(lambda: budget.shed == 1, "the reader stalled longest is ended")
        assert budget.unread == 4 * size <= budget.limit
        # Its watch is cancelled at etcd at once, not when its reader comes back.
        await wait_until(lambda: etcd_watchers(etcd) == watching - 1, "etcd drops the ended watch")
        with pytest.raises(Lagged, match="watch_unread_budget_bytes"):
            await take(first, 1)  # no event before the error: what it held is gone
        assert await take(second, 4) == [f"{key}={str(i) * pad}" for i in range(4, 8)]
        await put(8, second, keeping_up)
        for watch in (first, second, keeping_up):
            await watch.aclose()
        assert budget.unread == 0 and not budget.holding and budget.shed == 1
    finally:
        await store.close()


@run_async
async def test_past_the_budget_the_stalled_readers_are_ended_not_a_reader_that_keeps_up(
    etcd: EtcdServer, prefix: str
) -> None:
    """Six watchers, each of its own directory, stalled one after the other on one small event each,
    within a budget of 10 such events' bytes; a reader of another directory, keeping up, is sent a
    record five times that size while it waits for its next event, which passes the budget. That
    reader holds the most bytes at that instant, yet it is not ended: the stalled ones are, the
    longest stalled first, until a quarter of the budget is free (four of them), and the reader
    takes its record."""
    pad = 1000
    store = Store.connect(etcd.url, prefix=prefix)
    smalls = [store.key(f"s{i}", "k") for i in range(6)]
    large = store.key("r", "k")
    size = len(smalls[0]) + pad
    budget = store.watch_budget
    budget.limit = 10 * size
    try:
        start = await revision(store) + 1
        stalled = [store.watch_prefix(store.key(f"s{i}", ""), start) for i in range(6)]
        reader = store.watch_prefix(store.key("r", ""), start)
        await store.txn([], [Put(large, b"r"), *(Put(key, b"") for key in smalls)])
        for watch, key in zip((reader, *stalled), (large, *smalls), strict=True):
            assert await take(watch, 1) == [f"{key}={'r' if watch is reader else ''}"]  # each stands
        for i, key in enumerate(smalls):
            await store.txn([], [Put(key, b"s" * pad)])
            await wait_until(lambda i=i: budget.unread == (i + 1) * size, f"stalled watch {i} holds one")
        # The reader waits for its next event (it keeps up); the stalled ones took theirs long ago.
        taking = asyncio.ensure_future(take(reader, 1))
        await store.txn([], [Put(large, b"y" * (5 * size - len(large)))])
        assert await taking == [f"{large}={'y' * (5 * size - len(large))}"], "not ended"
        assert budget.shed == 4
        for watch in stalled[:4]:
            with pytest.raises(Lagged, match="watch_unread_budget_bytes"):
                await take(watch, 1)
        for i, watch in enumerate(stalled[4:], 4):
            assert await take(watch, 1) == [f"{smalls[i]}={'s' * pad}"]
        for watch in (*stalled, reader):
            await watch.aclose()
        assert budget.unread == 0 and not budget.holding
    finally:
        await store.close()
