"""One etcd Watch stream shared by every watcher of a Store, as etcd's own client (clientv3) shares
one: a watch is a WatchCreateRequest on the stream, not a stream of its own.

etcd answers the creates of one stream in the order it received them, each with a `created`
response naming the watch id it chose, and holds a watch's events back until that response is
sent; so the oldest create not yet answered takes the id of each `created` response, and events are
routed to their watcher by watch id. Every create asks etcd to fragment: a response of etcd's max
request size or more (plus 512 KiB: ~2 MiB by default) comes as several, in order, each flagged
`fragment` but the last, and split anywhere, a revision's events too; each is delivered as it comes, so a
watcher's reader never learns, nor needs, where a revision's events end. A watcher that ends
sends a WatchCancelRequest for its id (or, still unanswered, when its id comes). The first
watcher opens the stream; the last one to end closes it. A watch of one key is often no watcher
here at all: watch_fanout serves it from one watcher of its whole directory, with this same
guarantee.

Guarantee: a watcher gets every event of its key range from its start revision on, in etcd's
revision order, each once — or, when that cannot go on, an error, never silence:
- its start revision compacted away is `Compacted`, for that watcher alone, and so is one past the
  revision etcd has reached when asked to be within it (`Unreached`: a revision of another history);
- a watcher whose reader leaves MAX_BEHIND events, or MAX_BEHIND_BYTES of them, unread ends with
  `Lagged` (a `Compacted`: re-list) after the events it holds, so one slow reader neither holds the
  others back nor grows the coordinator without bound;
- the watchers of a hub together hold at most its budget's bytes unread (the replica's
  `watch_unread_budget_bytes`, however many watchers there are; past it by at most one response):
  past it, those whose readers have taken none of their events for longest drop every event they
  hold and end `Lagged` at once, until a quarter of the budget is free, so many stalled readers
  (each within MAX_BEHIND_BYTES) cannot pin the replica's memory either, and a reader that keeps up
  (waiting in `next`, or taking events as they come) is ended only after every one stalled longer.
  Nothing is skipped: the reader gets the error in place of the events it had not taken, and
  re-lists;
- etcd refusing or cancelling a watch is `StoreUnavailable` for that watcher;
- the stream's failure (etcd unreachable or killed, the channel closed, an answer that fits no
  watcher) is `StoreUnavailable` for every watcher on it, after the events each had received; the
  next watcher opens a new stream.
Not guaranteed: that an event comes by any time (a watcher waits as long as etcd is silent and the
stream stands), nor any order between two watchers' events.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

import grpc
from aetcd import rpc

from holdfast.coordinator.store_errors import Compacted, Lagged, StoreUnavailable, Unreached

MAX_BEHIND = 4096  # events a watcher's reader may leave unread before the watcher ends Lagged
# And their bytes (keys and values): a count alone let one stalled reader of records near their cap
# (~100 KB) hold ~400 MB, and a tenant's few such calls exhaust the replica for every tenant. 4,096
# records of ~1.5 KB are ~6 MB, well within.
MAX_BEHIND_BYTES = 16 << 20
# Every watcher's unread bytes together: ~16 watchers at MAX_BEHIND_BYTES. A replica's readers are
# owners (their own record's few changes) and `holdfast watch`es that read as events come: together
# they leave little unread, and a reader far behind re-lists for what it lacks.
UNREAD_BUDGET_BYTES = 256 << 20
UNANSWERED = -1  # etcd's id for no watch (a refused create; progress for every watcher)


class Budget:
    """The unread bytes of every watcher of a hub: past `limit`, those stalled longest drop theirs
    and end Lagged. Stalled longest, not holding most: at the moment a response passes the limit, a
    reader that keeps up holds that response as stalled ones do, and shedding by bytes ended it
    while many smaller stalled watchers (one caller's, say) kept theirs. A stall is counted in
    events taken by every reader of the hub (no clock: it advances only while readers progress)
    since this reader last took one, or since a delivery found it waiting for one (a reader waiting
    in `next` is not stalled, however long its watch was quiet); of watchers stalled alike (every
    one waiting when a burst of responses came), the one holding most goes first. Only watchers
    holding events are kept, so an event costs a sum, a count and a set add, never a look at every
    watcher; the search runs only past the limit, and frees a quarter of it each time."""

    __slots__ = ("holding", "limit", "shed", "taken_count", "unread")

    def __init__(self, limit: int = UNREAD_BUDGET_BYTES) -> None:
        self.limit = limit
        self.unread = 0
        self.holding: set[Watcher] = set()  # those whose behind_bytes is not 0
        self.shed = 0  # watchers ended to keep within the limit
        self.taken_count = 0  # events taken by every reader: the stall's clock

    def hold(self, watcher: Watcher, size: int, waiting: bool) -> None:
        """`size` more bytes delivered to `watcher`; `waiting`: its reader was waiting in `next`."""
        if waiting:
            watcher.stalled_since = self.taken_count
        self.holding.add(watcher)
        self.unread += size
        if self.unread > self.limit:
            self._shed()

    def taken(self, watcher: Watcher, size: int) -> None:
        self.taken_count += 1
        watcher.stalled_since = self.taken_count
        self.unread -= size
        if not watcher.behind_bytes:
            self.holding.discard(watcher)

    def _shed(self) -> None:
        floor = self.limit - self.limit // 4
        for watcher in sorted(self.holding, key=lambda w: (w.stalled_since, -w.behind_bytes)):
            if self.unread <= floor:
                return
            held = watcher.behind_bytes
            self.shed += 1
            watcher.drop(Lagged(f"this replica's watches held more than {self.limit} bytes unread "
                                "together (watch_unread_budget_bytes); this one, whose reader had "
                                f"taken none of them for longest, dropped its {held}"))


class Watcher:
    """One watch on the shared stream: the events etcd sent it and its reader has not taken yet,
    and how it ended."""

    __slots__ = ("behind_bytes", "budget", "ended", "events", "gone", "id", "reached", "stalled_since",
                 "stream", "waker")

    def __init__(self, budget: Budget, reached: int = 0) -> None:
        self.budget = budget
        self.stream: Stream | None = None  # the one it was opened on (a key watcher is on none)
        self.id = UNANSWERED  # etcd's, from its `created` response
        self.reached = reached  # a revision etcd must have reached by its `created` response (0: none)
        self.events: collections.deque[rpc.Event] = collections.deque()
        self.behind_bytes = 0  # of the events held: their keys' and values' bytes
        self.ended: Exception | None = None
        self.waker: asyncio.Future[None] | None = None
        self.gone = False  # its reader ended it
        # The budget's count of events taken when its reader last took one, or a delivery found it
        # waiting for one.
        self.stalled_since = budget.taken_count

    def deliver(self, events: list[rpc.Event]) -> None:
        if self.ended is not None:
            return
        waiting = self.waker is not None  # its reader is in `next`, not stalled
        size = sum(_size(event) for event in events)
        self.events.extend(events)
        self.behind_bytes += size
        if len(self.events) > MAX_BEHIND or self.behind_bytes > MAX_BEHIND_BYTES:
            self.end(Lagged(f"the watch's reader left more than {MAX_BEHIND} events or "
                            f"{MAX_BEHIND_BYTES} bytes of them unread"))
        else:
            self._wake()
        if size:
            self.budget.hold(self, size, waiting)

    def end(self, error: Exception) -> None:
        """The watcher's reader gets this error once it has taken every event delivered before."""
        if self.ended is None:
            self.ended = error
        self._wake()

    def drop(self, error: Exception) -> None:
        """Ends with `error` at once, the events its reader has not taken dropped (it re-lists), and
        its watch at etcd cancelled: a stalled reader may not come back to close it for long, and
        etcd would go on sending it every event, each read here and thrown away."""
        self.ended = error
        self.release()
        self._wake()
        if self.stream is not None:
            self.stream.close(self)

    def release(self) -> None:
        """Its events no longer held: dropped, or its reader is done with it."""
        self.budget.unread -= self.behind_bytes
        self.budget.holding.discard(self)
        self.events.clear()
        self.behind_bytes = 0

    def _wake(self) -> None:
        if self.waker is not None and not self.waker.done():
            self.waker.set_result(None)

    async def next(self) -> rpc.Event:
        while not self.events:
            if self.ended is not None:
                raise self.ended
            self.waker = asyncio.get_running_loop().create_future()
            try:
                await self.waker
            finally:
                self.waker = None
        event = self.events.popleft()
        size = _size(event)
        self.behind_bytes -= size
        self.budget.taken(self, size)
        return event


def _size(event: rpc.Event) -> int:
    return len(event.kv.key) + len(event.kv.value)


class Stream:
    """One Watch call and the watchers on it."""

    def __init__(self, stub: rpc.WatchStub) -> None:
        self.requests: asyncio.Queue[rpc.WatchRequest] = asyncio.Queue()
        self.creating: collections.deque[Watcher] = collections.deque()  # in the order sent
        self.watchers: dict[int, Watcher] = {}
        self.cancelling: set[int] = set()
        self.live = 0  # watchers whose readers have not ended them
        self.lost = False  # failed or closed: no watcher joins it any more
        self.call = stub.Watch(self._send())
        self.reader = asyncio.create_task(self._read())

    async def _send(self) -> AsyncIterator[rpc.WatchRequest]:
        while True:
            yield await self.requests.get()

    def open(self, key: bytes, range_end: bytes, start_revision: int, watcher: Watcher) -> None:
        # Built before the watcher is queued: a request that cannot be built (a start revision past
        # int64) would leave a watcher no `created` answers, and every later watcher on the stream
        # would take the id, and the events, of the one after it.
        # Fragmented: unsplit, a watch behind by many large events (its start far back, or its
        # reader slow: etcd resends up to 1,000 revisions in one response) gets a response past the
        # channel's receive limit, which fails the stream and every watcher on it.
        create = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=key, range_end=range_end, start_revision=start_revision, fragment=True))
        # Queued and sent in one order, with nothing awaited between: the `created` responses
        # come back in this order too.
        self.creating.append(watcher)
        self.requests.put_nowait(create)
        self.live += 1
        watcher.stream = self

    def close(self, watcher: Watcher) -> None:
        """Its reader is done with `watcher`; the last one closes the stream."""
        if watcher.gone:
            return
        watcher.gone = True
        self.live -= 1
        if self.lost:
            return
        if self.live == 0:
            self.lost = True
            self.call.cancel()
            self.reader.cancel()
        elif self.watchers.pop(watcher.id, None) is not None:
            self._cancel(watcher.id)
        # Still unanswered: cancelled when its `created` response comes.

    def _cancel(self, watch_id: int) -> None:
        self.cancelling.add(watch_id)
        self.requests.put_nowait(rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch_id)))

    async def _read(self) -> None:
        why = "the coordinator closed the watch stream"
        try:
            async for response in self.call:
                self._route(response)
            why = "etcd ended the watch stream"
        except grpc.aio.AioRpcError as exc:
            why = f"etcd watch stream: {exc.code().name} {exc.details()}"
        except StoreUnavailable as exc:
            why = str(exc)
        finally:
            self.lost = True
            self.call.cancel()  # a stream given up on is not left open at etcd
            for watcher in [*self.creating, *self.watchers.values()]:
                watcher.end(StoreUnavailable(f"{why}; every event before this was delivered"))
            self.creating.clear()
            self.watchers.clear()

    def _route(self, response: rpc.WatchResponse) -> None:
        if response.created:
            if not self.creating:
                raise StoreUnavailable("etcd answered a watch create that was not sent")
            self._created(self.creating.popleft(), response)
            return
        watch_id = response.watch_id
        watcher = self.watchers.get(watch_id)
        if response.compact_revision:
            # etcd has dropped this watch: nothing to cancel.
            if watcher is not None:
                del self.watchers[watch_id]
                watcher.end(Compacted(f"compacted at {response.compact_revision}"))
        elif response.canceled:
            self.cancelling.discard(watch_id)
            if watcher is not None:
                del self.watchers[watch_id]
                watcher.end(StoreUnavailable(f"etcd cancelled the watch: {response.cancel_reason}"))
        elif watcher is not None:
            watcher.deliver(list(response.events))
        elif watch_id != UNANSWERED and watch_id not in self.cancelling:
            self._cancel(watch_id)  # events for a watch no watcher holds: stop them

    def _created(self, watcher: Watcher, response: rpc.WatchResponse) -> None:
        if response.canceled:
            watcher.end(StoreUnavailable(f"etcd refused the watch: {response.cancel_reason}"))
            return
        watcher.id = response.watch_id
        if watcher.gone:
            self._cancel(watcher.id)
            return
        if watcher.reached > response.header.revision:
            # etcd would wait for the revision and send what its own history has there.
            self._cancel(watcher.id)
            watcher.end(Unreached(f"revision {watcher.reached} is past etcd's {response.header.revision}"))
            return
        self.watchers[watcher.id] = watcher
        watcher.deliver(list(response.events))


class WatchHub:
    """The Store's watches: every watcher on one stream, a new stream once that one is lost."""

    def __init__(self, stub: rpc.WatchStub, budget: Budget) -> None:
        self._stub = stub
        self.budget = budget
        self._stream: Stream | None = None
        self.creates = 0  # WatchCreateRequests sent, on every stream

    def open(self, key: bytes, range_end: bytes, start_revision: int, watcher: Watcher) -> Stream:
        """`watcher` on the stream, created at etcd; its owner closes it on the stream returned."""
        stream = self._stream
        if stream is None or stream.lost:
            stream = self._stream = Stream(self._stub)
        stream.open(key, range_end, start_revision, watcher)
        self.creates += 1
        return stream

    async def watch(self, key: bytes, range_end: bytes, start_revision: int,
                    reached: int = 0) -> AsyncIterator[rpc.Event]:
        """Every event of [key, range_end) from `start_revision` on, until the caller stops reading
        (closing this generator cancels the watch) or the watch ends in an error; `Unreached` when
        etcd has not reached revision `reached` (a caller's, e.g. a grant's) by the watch's start."""
        watcher = Watcher(self.budget, reached)
        stream = self.open(key, range_end, start_revision, watcher)
        try:
            while True:
                yield await watcher.next()
        finally:
            watcher.release()
            stream.close(watcher)
