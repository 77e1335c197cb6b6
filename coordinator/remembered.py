"""The session records this replica's own transactions wrote, so that a decision following its own
write — a `run`'s Release after the grant this replica made, an Acquire of a session this replica
released — starts without reading the record.

Guarantee: a remembered entry is only ever where a decision starts. The decision's transaction
compares the record's mod revision *and* its bytes (`Seen(remembered=True)`), so it applies only
while etcd holds exactly the bytes remembered, which is what a fresh read would have returned; a
decision that loses its transaction, or would refuse, on a remembered entry is made again on a
fresh read (`Sessions.on_latest`; an Acquire grants on one or decides afresh:
`Acquisition.remembered_reads`). A stale entry therefore costs one round trip and never grants,
releases or refuses anything a fresh read would not. Not guaranteed: a hit — another replica's
write, more than `limit` writes since, or a record past MAX_VALUE_BYTES sends the decision to etcd
as before.
"""

from __future__ import annotations

from holdfast.coordinator.records import ETCD_REQUEST_LIMIT_BYTES
from holdfast.coordinator.store import Entry

# A remembered record's bytes ride its decision's transaction a second time, in the compare: a record
# of up to ~1 MB (its provider handles) fits etcd's request once, as a fresh read's transaction
# sends it, but not twice. Up to a quarter of the limit, the compare and the record written fit.
MAX_VALUE_BYTES = ETCD_REQUEST_LIMIT_BYTES // 4
LIMIT = 10_000  # ~1.6 KB an entry (a record is ~1.3 KB of JSON): ~16 MB at the limit, the newest kept


class Remembered:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._entries: dict[str, Entry] = {}  # etcd key -> the entry this replica's transaction wrote

    def wrote(self, entry: Entry) -> None:
        self._entries.pop(entry.key, None)  # re-inserted last: the oldest write is the first forgotten
        if len(entry.value) > MAX_VALUE_BYTES:
            return  # decided on a fresh read
        self._entries[entry.key] = entry
        if len(self._entries) > self.limit:
            del self._entries[next(iter(self._entries))]

    def lost(self, key: str) -> None:
        """A transaction on `key` lost: whatever is remembered for it is older than etcd's."""
        self._entries.pop(key, None)

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)
