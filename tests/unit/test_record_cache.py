"""The decoded-record cache serves only the decoding of the very bytes just read, as a fresh message."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.internal import encoder
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holdfast.coordinator import records
from holdfast.coordinator.record_cache import Changes, RecordCache
from holdfast.v1 import coordinator_pb2 as pb


def raw(fence: int) -> bytes:
    record = records.new_record("sess-cache-01", "codex", "")
    record.lease.fence = fence
    record.lease.claim_status = pb.LIVE
    return records.encode(record)


def test_a_hit_is_the_same_record_and_a_fresh_copy() -> None:
    cache = RecordCache()
    first = cache.decode("k", raw(3))
    first.lease.fence = 99  # a caller changing what it got changes nothing cached
    again = cache.decode("k", raw(3))
    assert again == records.decode_record(raw(3)) and again.lease.fence == 3


def test_other_bytes_under_the_same_key_are_decoded_afresh() -> None:
    cache = RecordCache()
    assert cache.decode("k", raw(3)).lease.fence == 3
    # e.g. an etcd restored from a backup: another value, possibly at a mod revision seen before.
    assert cache.decode("k", raw(4)).lease.fence == 4
    assert cache.decode("k", raw(3)).lease.fence == 3


def test_bounded() -> None:
    cache = RecordCache(limit=2)
    for key in ("a", "b", "c"):
        cache.decode(key, raw(1))
    assert len(cache) <= 2


def test_a_record_written_is_served_as_its_bytes_decode_without_parsing(monkeypatch) -> None:
    record = records.new_record("sess-cache-02", "codex", "")
    record.lease.fence = 7
    record.lease.owner.spawn_token = "t" * 32  # an owner without its variable: the read fills it in
    record.lease.spawn_token_env = "HOLDFAST_SPAWN_TOKEN"
    written = records.encode(record)
    expected = records.decode_record(written)
    assert expected != record, "the read's fill-in is part of what a hit must give"
    cache = RecordCache()
    cache.wrote("k", written, record)
    record.lease.fence = 99  # the writer changing its message afterwards changes nothing cached

    def parse(raw: bytes) -> pb.SessionRecord:
        raise AssertionError("a hit parses nothing")

    monkeypatch.setattr(records, "decode_record", parse)
    assert cache.decode("k", written) == expected


def test_a_record_no_read_would_decode_is_not_kept() -> None:
    record = records.new_record("sess-cache-03", "codex", "")
    record.schema_version = 999
    cache = RecordCache()
    cache.wrote("k", records.encode(record), record)
    assert len(cache) == 0


# Any SessionRecord a transition may write, field by field from its descriptor: each field set or
# not, a nested message possibly set but empty, enum numbers no version names, integers at their
# extremes, any unicode, and fields of a newer version (an agent's identity may carry them).
INTEGERS = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}
UNICODE = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def scalars(field: FieldDescriptor) -> st.SearchStrategy[object]:
    if field.type == FieldDescriptor.TYPE_STRING:
        return UNICODE
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=8)
    low, high = INTEGERS[field.type]
    named = [value.number for value in field.enum_type.values] if field.enum_type else []
    return st.sampled_from(named) | st.integers(low, high) if named else st.sampled_from((low, high, 0, 1))


def unknown_field(number: int, value: int) -> bytes:
    """A varint field `number` no version of this message defines, as a newer peer would send it."""
    return encoder._VarintBytes(number << 3) + encoder._VarintBytes(value)


@st.composite
def filled(draw: st.DrawFn, message: Message) -> None:
    for field in message.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        repeated = field.is_repeated
        if field.message_type is not None:
            for sub in ([getattr(message, field.name).add() for _ in range(draw(st.integers(1, 2)))]
                        if repeated else [getattr(message, field.name)]):
                sub.SetInParent()  # set, and perhaps left empty
                draw(filled(sub))
        elif repeated:
            getattr(message, field.name).extend(draw(st.lists(scalars(field), max_size=2)))
        else:
            setattr(message, field.name, draw(scalars(field)))
    if draw(st.booleans()):
        message.MergeFromString(unknown_field(draw(st.integers(1000, 2000)), draw(st.integers(0, 2**64 - 1))))


@st.composite
def written_records(draw: st.DrawFn) -> pb.SessionRecord:
    record = pb.SessionRecord()
    draw(filled(record))
    record.schema_version = draw(st.sampled_from((records.SCHEMA_VERSION, records.SCHEMA_VERSION,
                                                  records.SCHEMA_VERSION + 1)))
    return record


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_records())
def test_a_record_written_is_kept_as_its_bytes_decode(record: pb.SessionRecord) -> None:
    """What `wrote` keeps is what a read of the bytes written returns: `as_decoded(record)` equals
    `decode_record(encode(record))` (or both refuse), down to its serialization, and so does the
    cache's answer to a read of those bytes."""
    written = records.encode(record)
    try:
        read = records.decode_record(written)
    except ValueError:
        with pytest.raises(ValueError):
            records.as_decoded(record)
        return
    kept = records.as_decoded(record)
    assert kept == read
    assert kept.SerializeToString(deterministic=True) == read.SerializeToString(deterministic=True)
    cache = RecordCache()
    cache.wrote("k", written, record)
    served = cache.decode("k", written)
    assert served == read
    assert served.SerializeToString(deterministic=True) == read.SerializeToString(deterministic=True)


def test_a_watched_change_is_decoded_once_and_never_served_for_other_bytes_at_its_revision() -> None:
    """An etcd restored from a backup gives a key's revision to other bytes: those are decoded."""
    changes = Changes(RecordCache())
    first = changes.record("k", 7, raw(3))
    assert changes.record("k", 7, bytes(raw(3))) is first and changes.decodes == 1
    other = changes.record("k", 7, raw(4))
    assert other.lease.fence == 4 and changes.decodes == 2


def test_the_watched_changes_kept_are_bounded_by_count_and_bytes() -> None:
    size = len(raw(1))
    changes = Changes(RecordCache(), limit=3, max_bytes=2 * size)
    for i in range(5):
        changes.record(f"k{i}", 1, raw(1))
    assert changes.bytes <= 2 * size
    changes.record("k4", 1, raw(1))
    changes.record("k0", 1, raw(1))
    assert changes.decodes == 6  # k4 kept, k0 long gone
