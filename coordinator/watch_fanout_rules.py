"""What the shared watch of a directory (watch_fanout) holds: its most recent events, and the span of
revisions over which it holds every event of the directory. Pure: no I/O, no clock.

Guarantee: `covers(start, held, newest)` is true only when every event of the directory at or after
`start` is either in the buffer or not yet received (so it comes on the shared watch, after every
buffered one): the buffer is whole from `start` on, and `held` (the caller's revision, e.g. a
grant's) is one the shared watch saw etcd reach, so it is of this etcd's history. `since(key,
start)` is the buffered events of `key` (or of every key) from `start` on, in the order they came.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

Event = TypeVar("Event")


class Buffer(Generic[Event]):
    """The last events of a watch started at revision `start`, at most `size` of them and `max_bytes`
    of them together, each with its revision, key and size, in the order etcd sent them (its revision
    order)."""

    __slots__ = ("bytes", "events", "max_bytes", "reached", "size", "whole_from")

    def __init__(self, start: int, size: int, max_bytes: int) -> None:
        self.size = size
        # Bounded by bytes too: events may be large (a record up to ~1 MB), and a count alone would
        # let the buffer hold `size` of those.
        self.max_bytes = max_bytes
        self.bytes = 0
        self.events: collections.deque[tuple[int, bytes, Event, int]] = collections.deque()
        # Every event at or after `whole_from` that was received is still here.
        self.whole_from = start
        # A revision etcd has reached: of an event received, or the watch's start (`start - 1`,
        # proven by etcd's answer to its create: watch_hub's `reached`). Proof of history only, not
        # that every event up to it was received: a revision's events may come in several
        # responses (etcd's fragments), and `covers` needs no such claim (a start at or before a
        # revision still coming gets its rest live, one past it none of it).
        self.reached = start - 1

    def add(self, revision: int, key: bytes, event: Event, size: int) -> None:
        """`size`: the event's bytes (its key's and value's)."""
        self.events.append((revision, key, event, size))
        self.bytes += size
        self.reached = max(self.reached, revision)
        # An event bigger than `max_bytes` alone leaves too: the buffer is then whole only past it.
        while len(self.events) > self.size or self.bytes > self.max_bytes:
            # The oldest revision may still have events here (a transaction writing several keys);
            # wholeness is claimed only past it.
            dropped, _, _, dropped_size = self.events.popleft()
            self.bytes -= dropped_size
            self.whole_from = max(self.whole_from, dropped + 1)

    def covers(self, start: int, held: int, newest: int) -> bool:
        """Whether a watch of one key from `start` can be served from here. `held`: a revision the
        caller holds (0: none), which etcd must be seen to have reached, else it may be another
        history's (a snapshot restored below it); `newest`: the highest revision any of etcd's
        answers named, beyond which a start is not known to be of this history either."""
        return self.whole_from <= start and held <= self.reached and start - 1 <= max(self.reached, newest)

    def since(self, key: bytes | None, start: int) -> list[Event]:
        """The buffered events of `key` (None: of every key) at or after `start`, oldest first; read
        from the newest back, so a watch that starts near now reads only the few events since its
        start."""
        found = []
        for revision, k, event, _ in reversed(self.events):
            if revision < start:
                break
            if key is None or k == key:
                found.append(event)
        found.reverse()
        return found
