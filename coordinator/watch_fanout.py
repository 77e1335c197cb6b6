"""Watches of one directory (an owner's watch of its own session record, a WatchSessions of every
session) served in-process from one etcd watch of the whole directory, so that such a watch costs
etcd no WatchCreateRequest and no WatchCancelRequest, and a change costs only the watches it is for.

The directory's shared watch is opened, on the Store's shared stream (watch_hub), by the first
watch served from it, at the revision after the newest any answer of etcd's named (never at an
older start: etcd's catch-up of the whole directory is every session's records since), and
is then kept for the Store's life: a replica serves owners all the time, and a watch closed between
two of them would have every next owner find it not yet created. Its most recent events, at most
BUFFERED and BUFFERED_BYTES of them, are kept (watch_fanout_rules.Buffer), each with only its key,
revision and size read. An event is handed on to the watchers of its key, and to the watchers of
the whole directory that want its tag: a put is tagged (for session records, decoded for their
tenant) once, only while there are such watchers, so with none no other session's change is
decoded. A watch from revision R is served from it when the buffer is whole from R on and the
caller's revision is one the shared watch saw etcd reach; else it is a watch of its own, exactly
as `watch_hub.WatchHub.watch` (also while the shared watch is not yet created, and when it has
failed: the next watch opens a new one).

Guarantee: every watcher, served or not, has watch_hub's guarantee — every event of its key (a
tagged watcher: every put of the directory tagged as it wants or untagged, and the deletion of every
key whose last put was: a deletion has its key's last put's tag when tagged watchers have been there
since that put, else it goes to every tagged watcher) from its start revision on, in revision order,
each once, or an error, never silence; a tagged watch not served gets every event of the directory,
a superset. A served watcher gets the buffered events it wants from R on, then the live ones (both
in the order etcd sent them: nothing is awaited between reading the buffer and joining, so no event
falls between); its reader leaving MAX_BEHIND events (or MAX_BEHIND_BYTES) unread ends it `Lagged`,
and its unread bytes count in the hub's budget as a watch of its own's do; the shared watch's
failure ends every served watcher with the error a watch of its own would have had on it (the
stream's failure `StoreUnavailable`, a compaction `Compacted`, etcd's cancel `StoreUnavailable`),
after the events it had received. A start etcd has compacted away is served all the same while the
buffer still holds every event from it: nothing is missing, so there is nothing to re-list for (a
watch of its own would end `Compacted` and its caller re-list).
Not guaranteed: that a watch is served (a key's watch gets the same events either way, a tagged one
at least those it wants), nor any order between two watchers' events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection

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
# A put's tag (for session records, their tenant), computed once per event for every tagged watcher
# of the directory; None: every tagged watcher's. A deletion names only its key: see REMEMBERED_TAGS.
Tag = Callable[[rpc.Event], str | None]
# Keys whose last put was tagged, with its tag, so that a deletion (its event names only the key)
# reaches only the watchers its put did; a key not remembered (put before, or forgotten past this
# many) is deleted to every tagged watcher, as an untagged event is. ~150 bytes each: ~15 MB.
REMEMBERED_TAGS = 100_000


class KeyWatcher(Watcher):
    """A watch of one key served from the shared watch, from revision `start` on."""

    __slots__ = ("start",)

    def __init__(self, budget: Budget, start: int) -> None:
        super().__init__(budget)
        self.start = start


class SharedWatch(Watcher):
    """The directory's one watch on the stream: every event into the buffer, to its key's watchers,
    and to the watchers of the whole directory that want its tag."""

    __slots__ = ("buffer", "handed", "keys", "tag", "tagged", "tags")

    def __init__(self, budget: Budget, start: int) -> None:
        # etcd must have reached the revision before the start by its `created` answer: a start
        # beyond it is another history's, and the shared watch ends Unreached, serving no one.
        # Its own events are its buffer's (BUFFERED_BYTES); its key watchers' count in `budget`.
        super().__init__(budget, reached=start - 1)
        self.buffer: Buffer[rpc.Event] = Buffer(start, BUFFERED, BUFFERED_BYTES)
        self.keys: dict[bytes, list[KeyWatcher]] = {}
        # Watchers of the whole directory by the tag they want (None: every event), and how puts
        # are tagged (set by each that joins: every caller of a directory tags it alike).
        self.tagged: dict[str | None, set[KeyWatcher]] = {}  # a set: thousands leave one by one
        self.tag: Tag | None = None
        self.tags: dict[bytes, str] = {}  # by key, its last tagged put's tag (REMEMBERED_TAGS)
        self.handed = 0  # events handed to watchers: a change costs each watcher it reaches

    def deliver(self, events: list[rpc.Event]) -> None:
        if self.ended is not None:
            return
        for event in events:
            kv = event.kv
            key = kv.key
            self.buffer.add(kv.mod_revision, key, event, len(key) + len(kv.value))
            self._hand(event, self.keys.get(key, ()))
            if self.tagged:
                for watchers in self._wanting(event):
                    self._hand(event, watchers)

    def _hand(self, event: rpc.Event, watchers: Collection[KeyWatcher]) -> None:
        for watcher in watchers:
            # A watcher may start past what the shared watch has received (a listing read at a
            # revision it has not reached yet): an older event is not its own.
            if event.kv.mod_revision >= watcher.start:
                self.handed += 1
                watcher.deliver([event])

    def _wanting(self, event: rpc.Event) -> list[set[KeyWatcher]]:
        """The tagged watchers `event` is for: its tag's and those of every tag (None). A deletion
        has its key's last put's tag, when that is remembered."""
        key = event.kv.key
        if event.type == rpc.Event.PUT:
            tag = self._tag_of(event)
            self.tags.pop(key, None)  # re-put last: the oldest are forgotten first
            if tag is not None:
                self.tags[key] = tag
                if len(self.tags) > REMEMBERED_TAGS:
                    del self.tags[next(iter(self.tags))]
        else:
            tag = self.tags.pop(key, None)
        if tag is None:
            return list(self.tagged.values())
        return [self.tagged.get(tag, set()), self.tagged.get(None, set())]

    def _tag_of(self, event: rpc.Event) -> str | None:
        if self.tag is None or event.type != rpc.Event.PUT:
            return None
        try:
            return self.tag(event)
        except Exception:  # any: this runs on the reader of the Store's one watch stream
            # A record the tag cannot read (a key not UTF-8, JSON nested past the recursion limit)
            # is untagged: every call reads it and fails on it alone, as it would on a watch of its
            # own. Raised here, it would end the stream and every watch on it, owners' included.
            return None

    def end(self, error: Exception) -> None:
        if self.ended is not None:
            return
        self.ended = error
        for watchers in (*self.keys.values(), *self.tagged.values()):
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
            self.handed += len(buffered)
            watcher.deliver(buffered)
        self.keys.setdefault(key, []).append(watcher)
        return watcher

    def join_tagged(self, tag: str | None, start: int) -> KeyWatcher:
        """A watcher of every put tagged `tag` (None: of every put) and of deletions (`_wanting`; each
        buffered one), from `start`."""
        watcher = KeyWatcher(self.budget, start)
        buffered = [event for event in self.buffer.since(None, start)
                    if tag is None or self._tag_of(event) in (None, tag)]
        if buffered:
            self.handed += len(buffered)
            watcher.deliver(buffered)
        self.tagged.setdefault(tag, set()).add(watcher)
        return watcher

    def leave(self, key: bytes | None, tag: str | None, watcher: KeyWatcher) -> None:
        """`watcher`, of `key`, or (key None) of the whole directory's puts tagged `tag`, leaves."""
        if key is None:
            wanting = self.tagged.get(tag)
            if wanting is not None:
                wanting.discard(watcher)
                if not wanting:
                    del self.tagged[tag]
                if not self.tagged:
                    # Untagged events pass unread from now on: a tag kept could go stale (the key
                    # deleted and put again by another tenant) and keep its deletion from a watcher.
                    self.tags.clear()
            return
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
        self._handed = 0  # by the shared watches before this one

    def serve(self, key: bytes, start_revision: int, reached: int,
              newest: int) -> AsyncIterator[rpc.Event] | None:
        """The events of `key` from `start_revision` on, from the shared watch; None when it cannot
        prove it holds every one of them (the caller then watches on its own)."""
        shared = self._proven(start_revision, reached, newest)
        if shared is None:
            return None
        return self._events(shared, key, None, shared.join(key, start_revision))

    def serve_tagged(self, tag: Tag, wanted: str | None, start_revision: int,
                     newest: int) -> AsyncIterator[rpc.Event] | None:
        """Every put of the directory that `tag` tags `wanted` or None (`wanted` None: every put),
        and the deletions of the keys whose puts it got (module docstring), from `start_revision`
        on, from the shared watch; None as `serve`. Each put is tagged once for every such watcher,
        and reaches only those that want it."""
        shared = self._proven(start_revision, 0, newest)
        if shared is None:
            return None
        shared.tag = tag
        return self._events(shared, None, wanted, shared.join_tagged(wanted, start_revision))

    def _proven(self, start_revision: int, reached: int, newest: int) -> SharedWatch | None:
        """The shared watch, when it holds every event from `start_revision` on (else None)."""
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
        return shared

    @property
    def handed(self) -> int:
        """Events its shared watches handed to their watchers."""
        return self._handed + (self._shared.handed if self._shared is not None else 0)

    def _open(self, start: int) -> None:
        if self._shared is not None and self._stream is not None:
            self._stream.close(self._shared)  # an ended one: no longer keeps its stream open
        if self._shared is not None:
            self._handed += self._shared.handed
        shared = SharedWatch(self._hub.budget, start)
        self._stream = self._hub.open(*self._range, start, shared)
        self._shared = shared

    @staticmethod
    async def _events(shared: SharedWatch, key: bytes | None, tag: str | None,
                      watcher: KeyWatcher) -> AsyncIterator[rpc.Event]:
        try:
            while True:
                yield await watcher.next()
        finally:
            watcher.release()
            shared.leave(key, tag, watcher)
