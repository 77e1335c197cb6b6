"""The store's errors, apart so that the store and its shared watch stream (watch_hub) both raise
them without importing each other; `holdfast.coordinator.store` re-exports them."""

from __future__ import annotations


class StoreUnavailable(Exception):
    """etcd could not be reached or did not answer. Nothing was written, unless `outcome_unknown`:
    a transaction sent but not answered (its deadline passed, its connection dropped) may still
    have been applied."""

    def __init__(self, message: str, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class AnswerTooLarge(StoreUnavailable):
    """etcd's answer to a read was over this client's receive limit: not the fault of any record,
    so never a RECORD_TOO_LARGE; an outage of that read (reads write nothing)."""


class TooLarge(Exception):
    """etcd refused a request over its size limit (its --max-request-bytes, or its gRPC message
    limit above that): nothing was written, and the same request is refused every time."""


class Compacted(Exception):
    """A watch cannot go on from where it is (its start revision was compacted away); the caller
    must re-list."""


class Unreached(Compacted):
    """A watch asked to start past the revision etcd has reached: the revision is not of this
    etcd's history (a snapshot restored below it, another cluster's etcd); the caller must re-list."""


class Lagged(Compacted):
    """A watcher's reader fell so far behind its events that the watch was ended rather than grow
    without bound; as after a compaction, the caller must re-list."""
