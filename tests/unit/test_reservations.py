"""A reservation is timed on this replica's own monotonic clock from its first reading of that
record revision, over the reservation's own window: a deadline a skewed clock wrote holds nothing."""

from __future__ import annotations

from holdfast.coordinator.reservations import ReservationClock
from holdfast.v1 import coordinator_pb2 as pb

# Written by a replica 3 h ahead: its deadline is 3 h from now on every other clock.
AHEAD = pb.Lease(reserved_at_unix_ms=10_800_000 + 5_000, commit_deadline_unix_ms=10_800_000 + 35_000)


def test_half_the_window_after_the_first_reading_whatever_the_deadline_says() -> None:
    clock = ReservationClock()
    assert clock.wait_s("k", 7, AHEAD, now=100.0) == 15.0
    assert clock.wait_s("k", 7, AHEAD, now=110.0) == 5.0
    assert clock.wait_s("k", 7, AHEAD, now=115.0) == 0.0
    assert clock.wait_s("k", 8, AHEAD, now=115.0) == 15.0, "a new revision is a new reservation"


def test_a_full_table_starts_over_and_only_delays_a_question() -> None:
    clock = ReservationClock(limit=2)
    clock.wait_s("a", 1, AHEAD, now=0.0)
    clock.wait_s("b", 1, AHEAD, now=0.0)
    assert clock.wait_s("c", 1, AHEAD, now=50.0) == 15.0
    assert clock.wait_s("a", 1, AHEAD, now=50.0) == 15.0
