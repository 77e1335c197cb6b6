"""What a new record's first fence rests on: the archived record of the same id (archived before)
and the restore epoch's new-session floor (for ids the restored etcd never saw).

Guarantee: `revived` starts a record above both, and `revival_keys` names exactly the two keys it rests
on, which Acquire reads with the record in its one round trip and its grant compares (a re-archive
or a new floor meanwhile would otherwise reuse a fence number).
"""

from __future__ import annotations

from holdfast.coordinator import fencing, keys, records
from holdfast.coordinator.store import Seen, Store
from holdfast.v1 import coordinator_pb2 as pb


def revival_keys(store: Store, session_id: str) -> list[str]:
    """The reads `revived` needs for an id with no record: its archive record and the floor."""
    return [keys.archive_record(store, session_id), keys.new_session_floor(store)]


def archived_record(archived: Seen) -> pb.SessionRecord | None:
    return records.decode_record(archived.entry.value) if archived.entry is not None else None


def floor_of(read: Seen) -> int:
    """The new-session floor as read (0 when none was set)."""
    return int(read.entry.value) if read.entry is not None else 0


def revived(session_id: str, provider: str, location: str, archived: Seen,
            floor_read: Seen) -> pb.SessionRecord:
    """A new record: above the archived fence and history when the id was archived before, and
    above the restore epoch's floor for sessions the restored etcd never saw."""
    record = records.new_record(session_id, provider, location)
    epoch_floor = floor_of(floor_read)
    record.lease.minimum_next_fence = epoch_floor
    old = archived_record(archived)
    if old is not None:
        floor = fencing.next_fence(old.lease.fence, old.lease.minimum_next_fence)
        record.lease.minimum_next_fence = max(floor, epoch_floor)
        record.history_seq = old.history_seq
        record.tenant = old.tenant
    return record
