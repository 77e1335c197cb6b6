"""Watches of single keys of one directory (an owner's watch of its own session record, among every
session's) served in-process from one etcd watch of the whole directory, so that a key's watch
costs etcd no WatchCreateRequest and no WatchCancelRequest.

The directory's shared watch is opened, on the Store's shared stream (watch_hub), by the first
watch of one of its keys, at the revision after the newest any answer of etcd's named (never at an
older start: etcd's catch-up of the whole directory is every session's records since), and
is then kept for the Store's life: a replica serves owners all the time, and a watch closed between
two of them would have every next owner find it not yet created. Its most recent events, at most
BUFFERED and BUFFERED_BYTES of them, are kept (watch_fanout_rules.Buffer),
each with only its key, revision and size read; an event is handed on only to the watchers of its key, so
no other session's change is decoded. A watch of a key from revision R is served from it when the
buffer is whole from R on and the caller's revision is one the shared watch saw etcd reach; else it
is a watch of its own, exactly as `watch_hub.WatchHub.watch` (also while the shared watch is not yet
created, and when it has failed: the next watch opens a new one).

Guarantee: every watcher, served or not, has watch_hub's guarantee — every event of its key from its
start revision on, in revision order, each once, or an error, never silence. A served watcher gets
the buffered events of its key from R on, then the live ones (both in the order etcd sent them:
nothing is awaited between reading the buffer and joining, so no event falls between); its reader
leaving MAX_BEHIND events (or MAX_BEHIND_BYTES) unread ends it `Lagged`, and its unread bytes count
in the hub's budget as a watch of its own's do; the shared watch's failure
ends every served watcher with the error a watch of its own would have had on it (the stream's
failure `StoreUnavailable`, a compaction `Compacted`, etcd's cancel `StoreUnavailable`), after the
events it had received. A start etcd has compacted away is served all the same while the buffer
still holds every event from it: nothing is missing, so there is nothing to re-list for (a watch of
its own would end `Compacted` and its caller re-list).
Not guaranteed: that a watch is served (a caller gets the same events either way), nor any order
between two watchers' events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aetcd import rpc

from holdfast.coordinator.watch_fanout_rules import Buffer
from holdfast.coordinator.watch_hub import UNANSWERED, Budget, Stream, Watcher, WatchHub

# Events of the directory kept for watches that start after them (an owner's watch opens a few
# milliseconds after its grant): ~200 ms of a cluster changing 5,000 session records a second,
# ~1.5 KB each, so ~1.5 MB per replica. Bounded by bytes too (an event's key and value): a record
# may be ~1 MB (its provider handles), and 1,024 of those would be ~1 GB per replica; 16 MiB still
# holds ~10,000 records of 1.5 KB, more than BUFFERED.
BUFFERED = 1024
BUFFERED_BYTES = 16 << 20


class KeyWatcher(Watcher):
    """A watch of one key served from the shared watch, from revision `start` on."""

    __slots__ = ("start",)

    def __init__(self, budget: Budget, start: int) -> None:
        super().__init__(budget)
        self.start = start


class SharedWatch(Watcher):
    """The directory's one watch on the stream: every event into the buffer, and to its key's
    watchers."""

    __slots__ = ("buffer", "keys")

    def __init__(self, budget: Budget, start: int) -> None:
        # etcd must have reached the revision before the start by its `created` answer: a start
        # beyond it is another history's, and the shared watch ends Unreached, serving no one.
        # Its own events are its buffer's (BUFFERED_BYTES); its key watchers' count in `budget`.
        super().__init__(budget, reached=start - 1)
        self.buffer: Buffer[rpc.Event] = Buffer(start, BUFFERED, BUFFERED_BYTES)
        self.keys: dict[bytes, list[KeyWatcher]] = {}

    def deliver(self, events: list[rpc.Event]) -> None:
        if self.ended is not None:
            return
        for event in events:
            kv = event.kv
            key = kv.key
            self.buffer.add(kv.mod_revision, key, event, len(key) + len(kv.value))
            for watcher in self.keys.get(key, ()):
                # A watcher may start past what the shared watch has received (a listing read at a
                # revision it has not reached yet): an older event of its key is not its own.
                if kv.mod_revision >= watcher.start:
                    watcher.deliver([event])

    def end(self, error: Exception) -> None:
        if self.ended is not None:
            return
        self.ended = error
        for watchers in self.keys.values():
            for watcher in watchers:
                # One error each, as a watch of its own gets: one instance raised in several
                # readers would carry every reader's traceback.
                watcher.end(type(error)(*error.args))

    @property
    def created(self) -> bool:
        """etcd answered its create, and it has not ended: every event from its start comes."""
        return self.id != UNANSWERED and self.ended is None

    def join(self, key: bytes, start: int) -> KeyWatcher:
        watcher = KeyWatcher(self.budget, start)
        buffered = self.buffer.since(key, start)
        if buffered:
            watcher.deliver(buffered)
        self.keys.setdefault(key, []).append(watcher)
        return watcher

    def leave(self, key: bytes, watcher: KeyWatcher) -> None:
        watchers = self.keys.get(key)
        if watchers is not None and watcher in watchers:
            watchers.remove(watcher)
            if not watchers:
                del self.keys[key]


class Fanout:
    """The watches of single keys in [directory, range_end): served from its shared watch when it
    can."""

    def __init__(self, hub: WatchHub, directory: bytes, range_end: bytes) -> None:
        self._hub = hub
        self._range = directory, range_end
        self._shared: SharedWatch | None = None
        self._stream: Stream | None = None

    def serve(self, key: bytes, start_revision: int, reached: int,
              newest: int) -> AsyncIterator[rpc.Event] | None:
        """The events of `key` from `start_revision` on, from the shared watch; None when it cannot
        prove it holds every one of them (the caller then watches on its own)."""
        shared = self._shared
        if shared is None or shared.ended is not None:
            # At the revision after the newest etcd answered, never at the caller's start: from an
            # old one etcd would send every session's changes since (up to 10,000 revisions of
            # records up to ~1 MB), all read to be buffered and mostly dropped at once. A caller
            # older than it watches on its own (only its key's changes). From a revision, never
            # from "now" (0): the buffer's wholeness is counted from the revision asked for; none
            # named yet (no answer from etcd), none is opened.
            if newest > 0:
                self._open(newest + 1)
            return None
        if not shared.created or not shared.buffer.covers(start_revision, reached, newest):
            return None
        return self._events(shared, key, shared.join(key, start_revision))

    def _open(self, start: int) -> None:
        if self._shared is not None and self._stream is not None:
            self._stream.close(self._shared)  # an ended one: no longer keeps its stream open
        shared = SharedWatch(self._hub.budget, start)
        self._stream = self._hub.open(*self._range, start, shared)
        self._shared = shared

    @staticmethod
    async def _events(shared: SharedWatch, key: bytes, watcher: KeyWatcher) -> AsyncIterator[rpc.Event]:
        try:
            while True:
                yield await watcher.next()
        finally:
            watcher.release()
            shared.leave(key, watcher)
