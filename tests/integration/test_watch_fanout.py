"""Watches of one key served from one shared watch of its directory (coordinator/watch_fanout.py), over
a real etcd: a served watch sends etcd no create (etcd's own watcher count says so) and gets its key's
events from its start on, buffered then live, in order, once; a start the buffer cannot prove falls
back to a watch of its own; compaction, a slow reader and a killed etcd end served watches with the
errors a watch of its own has, never in silence."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aetcd import rpc

from holdfast.coordinator import watch_fanout, watch_hub
from holdfast.coordinator.store import Compacted, Entry, Put, Store
from holdfast.coordinator.store_errors import Unreached
from holdfast.localstack.etcd_server import EtcdServer
from tests.integration.coordinator_fixtures import etcd_server, run_async
from tests.integration.test_watch_hub import (
    etcd_watchers,
    killed_under,
    revision,
    slow_ends_lagged_alone,
    take,
)

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def own_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd no other test's watches come and go on: its watcher count is this test's alone."""
    yield from etcd_server(tmp_path_factory)


@contextlib.asynccontextmanager
async def connected(url: str, prefix: str) -> AsyncIterator[Store]:
    store = Store.connect(url, prefix=prefix)
    try:
        yield store
    finally:
        await store.close()


async def close(*watches: AsyncIterator[Entry | str]) -> None:
    for watch in watches:
        await watch.aclose()  # type: ignore[attr-defined]


def key(store: Store, sid: str) -> str:
    return store.key("sessions", sid)


async def put(store: Store, sid: str, value: str) -> int:
    return (await store.txn([], [Put(key(store, sid), value.encode())]))[1]


async def shared_open(store: Store) -> AsyncIterator[Entry | str]:
    """The directory's shared watch opened and created: the first watch of one of its keys opens it
    (and falls back), its create queued before that watch's own, so etcd answered it first; an
    event on the fallen-back watch shows its own create answered. Returns that watch, still open."""
    creates = store.watch_creates
    first = store.watch_key(key(store, "opener"), await revision(store) + 1)
    reading = asyncio.ensure_future(take(first, 1))
    await put(store, "opener", "x")
    assert await reading == [f"{key(store, 'opener')}=x"]
    assert store.watch_creates == creates + 2, "the shared watch and the first watch's own"
    return first


async def synced(store: Store, opener: AsyncIterator[Entry | str]) -> int:
    """A write of the directory the shared watch has received, with every one before it: etcd sends
    each revision's events to every watch of a stream before the next revision's, so once the opener
    has its event of the write after it, the shared watch has every event up to this one."""
    rev = await put(store, "opener", "synced")
    await put(store, "opener", "after")
    assert await take(opener, 2) == [f"{key(store, 'opener')}=synced", f"{key(store, 'opener')}=after"]
    return rev


@run_async
async def test_a_watch_that_starts_after_its_events_is_served_from_the_buffer_without_a_create(
    own_etcd: EtcdServer, prefix: str
) -> None:
    """Held at a revision the shared watch has seen: only its buffer can serve it, and etcd's own
    count of its watches shows no watch was made for it."""
    async with connected(own_etcd.url, prefix) as store:
        opener = await shared_open(store)
        first = await put(store, "s1", "1")
        await put(store, "s1x", "prefix-sibling")  # a key the watched key is a prefix of: not its own
        await put(store, "s2", "other")
        await store.txn([], [Put(key(store, "s1"), b"2"), Put(key(store, "s2"), b"both")])
        await store.txn([], [], deletes=[key(store, "s1")])
        held = await synced(store, opener)
        creates, watchers = store.watch_creates, etcd_watchers(own_etcd)
        # Held: the revision the shared watch must have seen, so only its buffer can serve it.
        served = store.watch_key(key(store, "s1"), first, held)
        got = asyncio.ensure_future(take(served, 4))
        await put(store, "s1", "3")  # then live, after the buffered ones
        assert await got == [f"{key(store, 's1')}=1", f"{key(store, 's1')}=2", key(store, "s1"),
                             f"{key(store, 's1')}=3"]
        assert store.watch_creates == creates, "no WatchCreateRequest for a served watch"
        assert etcd_watchers(own_etcd) == watchers, "etcd holds no watch for it"
        # The control: a watch from before the shared watch's start is one more at etcd.
        own = store.watch_key(key(store, "s1"), 1)
        reading = asyncio.ensure_future(take(own, 4))
        assert await reading == [f"{key(store, 's1')}=1", f"{key(store, 's1')}=2", key(store, "s1"),
                                 f"{key(store, 's1')}=3"]
        assert store.watch_creates == creates + 1 and etcd_watchers(own_etcd) == watchers + 1
        await close(served, own, opener)


@run_async
async def test_a_first_watch_from_far_back_leaves_the_stream_standing_and_the_next_served(
    own_etcd: EtcdServer, prefix: str
) -> None:
    """A first watch of the directory from an old start (a waiting Acquire's read revision): a shared
    watch opened there would have etcd send every session's changes since in one response, 21.6 MB
    here, past the channel's 16 MiB receive limit, failing the Store's one stream and every watch on
    it. Opened at the revision after the newest answer instead: the old start watches its own key
    alone, the bystander stays, and the next owner's watch from the newest answer on is served."""
    async with connected(own_etcd.url, prefix) as store:
        old = await revision(store) + 1
        bystander = store.watch_prefix(store.key("other", ""), old)
        standing = asyncio.ensure_future(take(bystander, 1))
        for _ in range(24):
            await store.txn([], [Put(key(store, "big"), b"x" * 900_000)])
        creates = store.watch_creates
        waiter = store.watch_key(key(store, "mine"), old)
        waiting = asyncio.ensure_future(take(waiter, 1))
        mine = await put(store, "mine", "1")
        await store.txn([], [Put(store.key("other", "k"), b"1")])
        assert await waiting == [f"{key(store, 'mine')}=1"]
        assert await standing == [f"{store.key('other', 'k')}=1"], "the stream stood"
        assert store.watch_creates == creates + 2, "the shared watch and the old start's own"
        # Its created answer came before the waiter's, and it has received `mine` (etcd sent it
        # before the bystander's later revision): a watch from there on is served.
        owner = store.watch_key(key(store, "owner"), mine + 1, mine)
        reading = asyncio.ensure_future(take(owner, 1))
        await put(store, "owner", "granted")
        assert await reading == [f"{key(store, 'owner')}=granted"]
        assert store.watch_creates == creates + 2, "served"
        await close(owner, waiter, bystander)


@run_async
async def test_a_watch_started_before_its_revision_gets_only_its_key_live_in_order(
    etcd: EtcdServer, prefix: str
) -> None:
    """Several keys, one twice, a key it is a prefix of, written in one transaction and apart."""
    async with connected(etcd.url, prefix) as store:
        opener = await shared_open(store)
        now = await synced(store, opener)
        creates = store.watch_creates
        sids = ("a1", "a2", "a1")  # one key watched twice
        watches = [store.watch_key(key(store, sid), now + 1, now) for sid in sids]
        readers = [asyncio.ensure_future(take(w, 3)) for w in watches]
        for value in range(3):
            await store.txn([], [Put(key(store, "a1"), f"{value}".encode()),
                                 Put(key(store, "a2"), f"{value}".encode())])
            await put(store, "a10", "not a1's")
        expected = [[f"{key(store, sid)}={v}" for v in range(3)] for sid in sids]
        assert await asyncio.gather(*readers) == expected
        assert store.watch_creates == creates
        # Nothing more than its own: the next change each sees is its key's next one.
        await put(store, "a2", "last")
        await store.txn([], [], deletes=[key(store, "a1")])
        assert await asyncio.gather(*(take(w, 1) for w in watches)) == [
            [key(store, "a1")], [f"{key(store, 'a2')}=last"], [key(store, "a1")]]
        await close(*watches, opener)


@run_async
async def test_a_start_the_buffer_cannot_prove_falls_back_to_a_watch_of_its_own(
    etcd: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_fanout, "BUFFERED", 3)
    async with connected(etcd.url, prefix) as store:
        opener = await shared_open(store)
        first = await put(store, "o1", "1")
        for i in range(2, 6):
            await put(store, "o1", f"{i}")
        now = await synced(store, opener)
        creates = store.watch_creates
        older = store.watch_key(key(store, "o1"), first, now)  # its first events left the buffer
        assert await take(older, 5) == [f"{key(store, 'o1')}={i}" for i in range(1, 6)]
        assert store.watch_creates == creates + 1, "a watch of its own"
        # A caller's revision the shared watch never saw etcd reach: not served, and its own watch
        # ends it Unreached (another history's revision), as it did before any sharing.
        with pytest.raises(Unreached):
            await take(store.watch_key(key(store, "o1"), now + 100, now + 99), 1)
        assert store.watch_creates == creates + 2
        await close(older, opener)


@run_async
async def test_compaction_ends_a_compacted_start_alone_and_the_shared_watch_outlives_compactions(
    etcd: EtcdServer, prefix: str
) -> None:
    """A start compacted away before any shared watch holds it is etcd's to answer: `Compacted`.
    A shared watch already following is not touched by a compaction (etcd's synced watches are not)."""
    async with connected(etcd.url, prefix) as store:
        old = await revision(store)
        await put(store, "c1", "1")
        now = await put(store, "c1", "2")
        await rpc.KVStub(store.channel).Compact(rpc.CompactionRequest(revision=now, physical=True))
        # The first watch opens the shared watch after the newest revision answered, not at its own
        # compacted start, and falls back: it alone ends Compacted.
        creates = store.watch_creates
        with pytest.raises(Compacted):
            await take(store.watch_key(key(store, "c1"), old + 1), 1)
        assert store.watch_creates == creates + 2
        # The shared watch's create was answered before that watch's: it serves from then on.
        steady = store.watch_key(key(store, "c1"), now + 1, now)
        reading = asyncio.ensure_future(take(steady, 1))
        later = await put(store, "c1", "3")
        assert await reading == [f"{key(store, 'c1')}=3"]
        assert store.watch_creates == creates + 2, "served"
        await rpc.KVStub(store.channel).Compact(rpc.CompactionRequest(revision=later, physical=True))
        await put(store, "c1", "4")
        assert await take(steady, 1) == [f"{key(store, 'c1')}=4"], "a live shared watch outlives compactions"
        await close(steady)


@run_async
async def test_a_served_reader_that_falls_behind_ends_lagged_after_its_events_alone(
    etcd: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with connected(etcd.url, prefix) as store:
        opener = await shared_open(store)
        now = await synced(store, opener)
        monkeypatch.setattr(watch_hub, "MAX_BEHIND", 5)  # for the watches below
        creates = store.watch_creates
        slow = store.watch_key(key(store, "l1"), now + 1, now)
        fast = store.watch_key(key(store, "l1"), now + 1, now)
        slow_first = asyncio.ensure_future(take(slow, 1))
        fast_first = asyncio.ensure_future(take(fast, 1))
        await put(store, "l1", "0")
        assert await slow_first == await fast_first == [f"{key(store, 'l1')}=0"]
        await slow_ends_lagged_alone(store, key(store, "l1"), slow, fast)
        assert store.watch_creates == creates
        await close(fast, opener)


@run_async
async def test_a_killed_etcd_ends_every_served_watch_unavailable_and_sharing_starts_again(
    tmp_path: Path, prefix: str
) -> None:
    server = EtcdServer(tmp_path / "etcd", fast_election=True).start()
    try:
        async with connected(server.url, prefix) as store:
            opener = await shared_open(store)
            now = await synced(store, opener)
            creates = store.watch_creates
            served = [store.watch_key(key(store, f"k{i % 2}"), now + 1, now) for i in range(4)]
            readers = [asyncio.ensure_future(take(w, 1)) for w in served]
            await store.txn([], [Put(key(store, "k0"), b"1"), Put(key(store, "k1"), b"1")])
            assert await asyncio.gather(*readers) == [[f"{key(store, f'k{i % 2}')}=1"] for i in range(4)]
            assert store.watch_creates == creates
            await killed_under(server, served)  # the shared watch's failure is each one's
            await revision(store)  # connected again
            # The next watch opens a new shared watch and falls back; the one after is served.
            again = await shared_open(store)
            now = await synced(store, again)
            creates = store.watch_creates
            after = store.watch_key(key(store, "k0"), now + 1, now)
            reading = asyncio.ensure_future(take(after, 1))
            await put(store, "k0", "2")
            assert await reading == [f"{key(store, 'k0')}=2"]
            assert store.watch_creates == creates
            await close(after, again)
    finally:
        server.stop()


# Another process's writes of session records: `argv` url, prefix, then each key, written in turn
# (the i-th with a value of i and ~63 KB, near the provider handle chain's 64 KiB cap).
WRITER = """
import asyncio, sys
from holdfast.coordinator.store import Put, Store

async def main(url, prefix, keys):
    store = Store.connect(url, prefix=prefix)
    for i, k in enumerate(keys):
        await store.txn([], [Put(k, f"{i:04d}".encode() + b"x" * 63_000)])
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
"""


@run_async
async def test_a_shared_watch_behind_by_many_large_records_keeps_the_stream_and_every_event(
    etcd: EtcdServer, prefix: str
) -> None:
    """The coordinator's loop blocked (busy or paused) while another process writes 600 session
    records of ~63 KB: etcd resends what the shared watch missed in one response of up to 1,000
    revisions, over 20 MB here, past the channel's 16 MiB receive limit; unfragmented, that failed the
    Store's one stream and every watch on it. Fragmented, the served watch gets every event of its
    key, in order, once, and the shared watch goes on serving."""
    async with connected(etcd.url, prefix) as store:
        opener = await shared_open(store)
        now = await synced(store, opener)
        creates = store.watch_creates
        served = store.watch_key(key(store, "s0"), now + 1, now)
        keys = [key(store, f"s{i % 5}") for i in range(600)]
        # Run from the loop's own thread: nothing of the stream is read until every write is done.
        subprocess.run([sys.executable, "-c", WRITER, etcd.url, prefix, *keys], check=True, timeout=40)
        got = []
        async for change in served:
            assert isinstance(change, Entry)
            got.append(change.value[:4].decode())
            if len(got) == 120:
                break
        assert got == [f"{i:04d}" for i in range(0, 600, 5)]
        last = await put(store, "s0", "after")
        assert await take(served, 1) == [f"{key(store, 's0')}=after"], "nothing twice, nothing more"
        later = store.watch_key(key(store, "s0"), last, last)
        assert await take(later, 1) == [f"{key(store, 's0')}=after"], "served from the buffer"
        assert store.watch_creates == creates, "the shared watch stood"
        await close(later, served, opener)


@run_async
async def test_a_tagged_watch_of_the_directory_gets_its_tags_puts_and_deletions_without_a_create(
    own_etcd: EtcdServer, prefix: str
) -> None:
    """Watches of the whole directory served from the shared watch by tag (a value's part before
    ":" here; a record's tenant for WatchSessions): each gets the puts of its tag, untagged ones
    and the deletions of keys whose put it got (or whose tag is not remembered: every buffered
    one), buffered then live, in order, once; a watch of every tag gets every event; a live put is
    tagged once for all of them; no create at etcd."""
    async with connected(own_etcd.url, prefix) as store:
        opener = await shared_open(store)
        tagged: list[str] = []

        def tag(entry: Entry) -> str | None:
            tagged.append(entry.key)
            return entry.value.split(b":")[0].decode() if b":" in entry.value else None

        start = await put(store, "t1", "a:1")
        await put(store, "t2", "b:1")
        await store.txn([], [], deletes=[key(store, "t2")])
        await put(store, "t3", "plain")
        await synced(store, opener)  # opener=synced, opener=after: untagged
        creates, watchers = store.watch_creates, etcd_watchers(own_etcd)
        directory = store.key("sessions", "")
        a_only = store.watch_tagged(directory, start, tag, "a")
        every = store.watch_tagged(directory, start, tag, None)
        a_got = asyncio.ensure_future(take(a_only, 6))
        every_got = asyncio.ensure_future(take(every, 9))
        await put(store, "t4", "b:2")
        await store.txn([], [], deletes=[key(store, "t4")])  # its put was b's: so is its deletion
        await put(store, "t1", "a:2")
        common = [key(store, "t2"), f"{key(store, 't3')}=plain", f"{key(store, 'opener')}=synced",
                  f"{key(store, 'opener')}=after"]
        assert await a_got == [f"{key(store, 't1')}=a:1", *common, f"{key(store, 't1')}=a:2"]
        assert await every_got == [f"{key(store, 't1')}=a:1", f"{key(store, 't2')}=b:1", *common,
                                   f"{key(store, 't4')}=b:2", key(store, "t4"), f"{key(store, 't1')}=a:2"]
        assert tagged.count(key(store, "t4")) == 1, "a live put is tagged once for every watch"
        assert store.watch_creates == creates and etcd_watchers(own_etcd) == watchers
        await close(a_only, every, opener)
