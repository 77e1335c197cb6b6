"""Decoded session records, so a record's JSON is parsed once rather than at every read.

Guarantee: a record is served from the cache only when the bytes just read from etcd hash (BLAKE2b,
128 bits) to the bytes it was decoded from, so a hit is the decoding of exactly what the read
returned — never a record other than the one read, whatever happened to revisions in between (an
etcd restored from a backup reuses mod revisions for other values). Decisions still compare what
they read in their own transactions; the cache only skips re-parsing identical bytes. Every call
returns a fresh message, so a caller that changes it changes nothing cached. A record this replica
writes is kept under the bytes it wrote (`wrote`), as `decode_record` of those bytes would give it,
so the next read of its own write parses nothing. Bounded: past `limit` keys it starts over.
"""

from __future__ import annotations

import hashlib

from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb

MAX_KEYS = 200_000  # ~0.3 KB a record: ~60 MB at the limit


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


class RecordCache:
    def __init__(self, limit: int = MAX_KEYS) -> None:
        self.limit = limit
        self._decoded: dict[str, tuple[bytes, bytes]] = {}  # etcd key -> (digest of JSON, binary record)

    def decode(self, key: str, raw: bytes) -> pb.SessionRecord:
        digest = _digest(raw)
        hit = self._decoded.get(key)
        if hit is not None and hit[0] == digest:
            return pb.SessionRecord.FromString(hit[1])
        record = records.decode_record(raw)
        self._keep(key, digest, record)
        return record

    def wrote(self, key: str, raw: bytes, record: pb.SessionRecord) -> None:
        """`record` was written at `key` as the bytes `raw` (records.encode of it)."""
        try:
            decoded = records.as_decoded(record)
        except ValueError:
            return  # a record no read would decode: its read raises as before
        self._keep(key, _digest(raw), decoded)

    def _keep(self, key: str, digest: bytes, record: pb.SessionRecord) -> None:
        if len(self._decoded) >= self.limit:
            self._decoded.clear()
        self._decoded[key] = (digest, record.SerializeToString())

    def __len__(self) -> int:
        return len(self._decoded)
