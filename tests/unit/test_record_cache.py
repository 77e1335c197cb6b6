"""The decoded-record cache serves only the decoding of the very bytes just read, as a fresh message."""

from __future__ import annotations

from holdfast.coordinator import records
from holdfast.coordinator.record_cache import RecordCache
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
