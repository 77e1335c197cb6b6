"""Decoded session records, so a record's JSON is parsed once rather than at every read.

Guarantee: a record is served from the cache only when the bytes just read from etcd hash (BLAKE2b,
128 bits) to the bytes it was decoded from, so a hit is the decoding of exactly what the read
returned — never a record other than the one read, whatever happened to revisions in between (an
etcd restored from a backup reuses mod revisions for other values). Decisions still compare what
they read in their own transactions; the cache only skips re-parsing identical bytes. Every call
returns a fresh message, so a caller that changes it changes nothing cached. A record this replica
writes is kept under the bytes it wrote (`wrote`), as `decode_record` of those bytes would give it,
so the next read of its own write parses nothing. Bounded: past `limit` keys it starts over.
`Changes`, the watches' shared decodings, serves a record only for the very bytes it was decoded
from (compared whole), as one message shared read-only by every watch.
"""

from __future__ import annotations

import collections
import hashlib

from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb

MAX_KEYS = 200_000  # ~0.3 KB a record: ~60 MB at the limit
# The latest changes' records, shared by every watch of the replica (and the tagging of its shared
# watch of the sessions by tenant): decoding a change per call (even hashing ~60 KB to find it in a
# RecordCache) cost ~38 µs per open all-sessions call for each change by any tenant, a call shown
# nothing included. A change is read by every call within a few events of the newest, so the last
# ones are enough; bounded by their bytes too (records up to ~1 MB; and each
# is held twice, as read and decoded): 1,024 records of ~1.5 KB, 64 at the cap.
CHANGES_KEPT = 1024
CHANGES_KEPT_BYTES = 4 << 20


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


class Changes:
    """Records decoded once per replica for all its watches, by key: each kept with the exact bytes
    it was decoded from, the last CHANGES_KEPT (and CHANGES_KEPT_BYTES of their bytes)."""

    def __init__(self, decoded: RecordCache, limit: int = CHANGES_KEPT,
                 max_bytes: int = CHANGES_KEPT_BYTES) -> None:
        self.decoded = decoded  # where a record not kept here is decoded
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self.decodes = 0  # misses: records decoded
        # key -> (revision, the bytes, their record)
        self._kept: collections.OrderedDict[str, tuple[int, bytes, pb.SessionRecord]] = \
            collections.OrderedDict()

    def record(self, key: str, revision: int, raw: bytes) -> pb.SessionRecord:
        """The record `raw` holds, read at `key` as of `revision`. Shared by every caller: read it,
        never change it (a SessionEvent built with it holds a copy)."""
        hit = self._kept.get(key)
        # A hit cannot show anything a fresh decode would not: it is the decoding of these very bytes,
        # compared whole (not trusted to the revision: an etcd restored from a backup gives a key's
        # revision to other bytes). Comparing is a memcmp, far below a decode or a hash.
        if hit is not None and hit[0] == revision and hit[1] == raw:
            return hit[2]
        record = self.decoded.decode(key, raw)
        self.decodes += 1
        if hit is not None:
            del self._kept[key]
            self.bytes -= len(hit[1])
        self._kept[key] = (revision, raw, record)
        self.bytes += len(raw)
        while len(self._kept) > self.limit or self.bytes > self.max_bytes:
            _, (_, dropped, _) = self._kept.popitem(last=False)
            self.bytes -= len(dropped)
        return record
