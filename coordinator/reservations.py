"""How long this replica has seen a reservation, on its own monotonic clock (docs/design.md §3).

A reservation's commit deadline is a wall-clock time written by the replica that granted it: one
whose clock ran hours ahead held the session that long on every other replica. So each replica also
times every reservation itself, from the first time it read that very record revision, over the
reservation's own window (its deadline less its reservation time: one clock's difference, whatever
that clock's error).

Guarantee: `may_ask` is true only once half the window has passed on this replica's monotonic clock
since it first read this revision of the record — never sooner, or a gate still being spawned would
be superseded over and over. It only lets the Acquire ask the reserved host's agent whether any
process carries the reserved token; only that agent's complete answer (none does) supersedes the
reservation, in a grant comparing the record and that agent's registration. Bounded: past `limit`
readings it starts over, which only delays a question.
"""

from __future__ import annotations

import time

from holdfast.v1 import coordinator_pb2 as pb

LIMIT = 100_000


def window_s(lease: pb.Lease) -> float:
    return max(lease.commit_deadline_unix_ms - lease.reserved_at_unix_ms, 0) / 1000


class ReservationClock:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._first_read: dict[tuple[str, int], float] = {}  # (record key, mod revision) -> monotonic

    def wait_s(self, key: str, revision: int, lease: pb.Lease, now: float | None = None) -> float:
        """Seconds until this replica may ask about the reservation (0: it may now)."""
        now = time.monotonic() if now is None else now
        if len(self._first_read) >= self.limit and (key, revision) not in self._first_read:
            self._first_read.clear()
        first = self._first_read.setdefault((key, revision), now)
        return max(first + window_s(lease) / 2 - now, 0.0)
