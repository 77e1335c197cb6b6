"""The shared watch's hand-off to the watchers of one key (coordinator/watch_fanout.SharedWatch),
with etcd's own event messages and no etcd: what each watcher is given."""

from __future__ import annotations

from aetcd import rpc

from holdfast.coordinator.watch_fanout import SharedWatch
from holdfast.coordinator.watch_hub import Budget


def event(key: bytes, revision: int, value: bytes) -> rpc.Event:
    return rpc.Event(type=rpc.Event.PUT, kv=rpc.KeyValue(key=key, value=value, mod_revision=revision))


def values(events: object) -> list[bytes]:
    return [e.kv.value for e in events]  # type: ignore[attr-defined]


def test_a_watcher_that_starts_past_what_was_received_gets_nothing_older_than_its_start() -> None:
    """A listing read at revision 14 while the shared watch had received up to 9: its watch from 15
    must not be given the key's change at 12, older than the record the listing sent."""
    shared = SharedWatch(Budget(), start=10)
    watcher = shared.join(b"k", 15)
    shared.deliver([event(b"k", 12, b"older"), event(b"other", 13, b"x"), event(b"k", 15, b"newer")])
    assert values(watcher.events) == [b"newer"]


def test_a_watcher_gets_its_keys_buffered_events_from_its_start_then_the_live_ones() -> None:
    shared = SharedWatch(Budget(), start=10)
    shared.deliver([event(b"k", 10, b"a"), event(b"k", 11, b"b"), event(b"j", 12, b"c")])
    watcher = shared.join(b"k", 11)
    shared.deliver([event(b"k", 13, b"d")])
    assert values(watcher.events) == [b"b", b"d"]


def test_a_revision_split_across_responses_reaches_each_watcher_whole_wherever_it_joins() -> None:
    """etcd's fragments split a response anywhere, a revision's events too: revision 11 writes j, k
    and l, and its l comes in the next response. Watchers joining in between are served (etcd has
    reached 11) and each gets its key's events from its start, the buffered part then the rest,
    once; a start past 11 gets none of 11."""
    shared = SharedWatch(Budget(), start=10)
    shared.deliver([event(b"k", 10, b"k10"), event(b"j", 11, b"j11"), event(b"k", 11, b"k11")])
    assert shared.buffer.covers(11, 11, 11) and shared.buffer.covers(12, 11, 11)
    k_at = shared.join(b"k", 11)
    l_at = shared.join(b"l", 11)
    k_past = shared.join(b"k", 12)
    shared.deliver([event(b"l", 11, b"l11"), event(b"k", 12, b"k12")])
    assert values(k_at.events) == [b"k11", b"k12"]
    assert values(l_at.events) == [b"l11"]
    assert values(k_past.events) == [b"k12"]
