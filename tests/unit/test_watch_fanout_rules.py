"""The shared watch's buffer (coordinator/watch_fanout_rules.py): which watches of one key it can
serve, and what it hands a watch that joins it."""

from __future__ import annotations

from holdfast.coordinator.watch_fanout_rules import Buffer


def filled(start: int, size: int, events: list[tuple[int, bytes]], max_bytes: int = 1 << 20) -> Buffer[str]:
    """Each event of 10 bytes."""
    buffer: Buffer[str] = Buffer(start, size, max_bytes)
    for revision, key in events:
        buffer.add(revision, key, f"{key.decode()}@{revision}", 10)
    return buffer


def test_a_new_buffer_covers_from_its_start_up_to_what_etcd_answered_its_create_with() -> None:
    buffer = filled(10, 4, [])
    assert buffer.covers(10, 9, 0), "the start, with the revision before it held (proven at create)"
    assert not buffer.covers(9, 0, 100), "before its start: events it never asked for"
    assert not buffer.covers(11, 10, 100), "a held revision no event or create showed etcd reach"
    assert buffer.covers(11, 0, 10), "held nothing, and the start is within what etcd answered"
    assert not buffer.covers(12, 0, 10), "a start past every revision etcd named: maybe another history"


def test_events_raise_what_is_reached_and_a_full_buffer_gives_up_its_oldest_revisions() -> None:
    buffer = filled(10, 3, [(10, b"a"), (12, b"b"), (12, b"c")])
    assert buffer.reached == 12 and buffer.whole_from == 10
    assert buffer.covers(13, 12, 0) and buffer.covers(10, 12, 0)
    buffer.add(15, b"a", "a@15", 10)  # 10 leaves
    assert buffer.whole_from == 11 and not buffer.covers(10, 0, 20)
    assert buffer.covers(11, 15, 0) and not buffer.covers(11, 16, 20)
    buffer.add(16, b"d", "d@16", 10)  # one of revision 12's two events leaves: 12 is no longer whole
    assert buffer.whole_from == 13 and not buffer.covers(12, 0, 20) and buffer.covers(13, 0, 20)
    assert [revision for revision, _, _, _ in buffer.events] == [12, 15, 16]


def test_a_buffer_over_its_bytes_gives_up_its_oldest_revisions_as_a_full_one_does() -> None:
    buffer = filled(10, 100, [(10, b"a"), (12, b"b"), (12, b"c")], max_bytes=35)
    assert buffer.bytes == 30 and buffer.whole_from == 10
    buffer.add(13, b"a", "a@13", 10)  # 40 bytes: 10 leaves
    assert buffer.whole_from == 11 and buffer.bytes == 30 and buffer.covers(11, 13, 0)
    assert not buffer.covers(10, 13, 0)
    buffer.add(14, b"d", "d@14", 20)  # 50 bytes: both of revision 12's events leave
    assert buffer.whole_from == 13 and buffer.bytes == 30 and not buffer.covers(12, 14, 0)
    assert buffer.covers(13, 14, 0) and buffer.since(b"a", 13) == ["a@13"]
    assert [revision for revision, _, _, _ in buffer.events] == [13, 14]


def test_an_event_bigger_than_the_whole_bound_leaves_the_buffer_whole_only_past_it() -> None:
    buffer = filled(10, 100, [(10, b"a"), (11, b"b")], max_bytes=35)
    buffer.add(12, b"big", "big@12", 36)
    assert not buffer.events and buffer.bytes == 0
    assert buffer.whole_from == 13 and buffer.reached == 12
    assert not buffer.covers(12, 12, 0), "its own revision is no longer held"
    assert buffer.covers(13, 12, 0) and buffer.since(b"big", 12) == []
    buffer.add(13, b"a", "a@13", 10)
    assert buffer.since(b"a", 13) == ["a@13"] and buffer.whole_from == 13


def test_since_is_the_key_s_own_events_from_the_start_oldest_first() -> None:
    buffer = filled(1, 10, [(1, b"a"), (2, b"b"), (3, b"a"), (3, b"ab"), (5, b"a"), (6, b"b")])
    assert buffer.since(b"a", 1) == ["a@1", "a@3", "a@5"]
    assert buffer.since(b"a", 3) == ["a@3", "a@5"]
    assert buffer.since(b"a", 4) == ["a@5"]
    assert buffer.since(b"a", 6) == [] and buffer.since(b"a", 7) == []
    assert buffer.since(b"ab", 1) == ["ab@3"], "a key, not a prefix"
    assert buffer.since(b"c", 1) == []
    assert buffer.since(None, 3) == ["a@3", "ab@3", "a@5", "b@6"], "every key's"
