"""The shared watch's buffer (coordinator/watch_fanout_rules.py): which watches of one key it can
serve, and what it hands a watch that joins it."""

from __future__ import annotations

from holdfast.coordinator.watch_fanout_rules import Buffer


def filled(start: int, size: int, events: list[tuple[int, bytes]]) -> Buffer[str]:
    buffer: Buffer[str] = Buffer(start, size)
    for revision, key in events:
        buffer.add(revision, key, f"{key.decode()}@{revision}")
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
    buffer.add(15, b"a", "a@15")  # 10 leaves
    assert buffer.whole_from == 11 and not buffer.covers(10, 0, 20)
    assert buffer.covers(11, 15, 0) and not buffer.covers(11, 16, 20)
    buffer.add(16, b"d", "d@16")  # one of revision 12's two events leaves: 12 is no longer whole
    assert buffer.whole_from == 13 and not buffer.covers(12, 0, 20) and buffer.covers(13, 0, 20)
    assert [revision for revision, _, _ in buffer.events] == [12, 15, 16]


def test_since_is_the_key_s_own_events_from_the_start_oldest_first() -> None:
    buffer = filled(1, 10, [(1, b"a"), (2, b"b"), (3, b"a"), (3, b"ab"), (5, b"a"), (6, b"b")])
    assert buffer.since(b"a", 1) == ["a@1", "a@3", "a@5"]
    assert buffer.since(b"a", 3) == ["a@3", "a@5"]
    assert buffer.since(b"a", 4) == ["a@5"]
    assert buffer.since(b"a", 6) == [] and buffer.since(b"a", 7) == []
    assert buffer.since(b"ab", 1) == ["ab@3"], "a key, not a prefix"
    assert buffer.since(b"c", 1) == []
