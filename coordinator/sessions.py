"""Session records and their transitions over etcd: the one place a record is read and written.

Guarantee: every transition is one transaction writing the record, its `fence/<id>` value and a
history entry (capped at HISTORY_KEPT), applied only while the record and every other key the
decision read are as they were read (docs/transactions.md); a lost race writes nothing and says so.
A probe of an owner is answered by its own host's agent, and returned with that host's
registration as read, so a decision on the answer can compare it. Shared by the RPC servicer and
the lifecycle operations, neither of which reaches into the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from holdfast.common import identifiers
from holdfast.common.logs import session_fields
from holdfast.common.reasons import Reason
from holdfast.coordinator import adjudication, fencing, keys, records
from holdfast.coordinator.adjudication import AcquireAsk
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.record_cache import Changes, RecordCache
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.registry import decode as decode_registration
from holdfast.coordinator.remembered import Remembered
from holdfast.coordinator.routing import Router
from holdfast.coordinator.store import Compacted, Entry, Put, Seen, Store, unchanged
from holdfast.coordinator.store_errors import Unreached
from holdfast.proc.ending import KILL_WAIT_S
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

HISTORY_KEPT = 64
T = TypeVar("T")
# A decision on a record as its entry holds it, with the reads that compare it; None when it lost.
Decision = Callable[[Entry, pb.SessionRecord, list[Seen]], Awaitable[T | None]]
log = logging.getLogger("holdfast.coordinator.sessions")


def now_ms() -> int:
    return int(time.time() * 1000)


class Sessions:
    def __init__(self, store: Store, registry: Registry, router: Router) -> None:
        self.store = store
        self.registry = registry
        self.router = router
        self.decoded = RecordCache()
        self.watched = Changes(self.decoded)  # the watches' records, decoded once for them all
        self.remembered = Remembered()

    def key(self, session_id: str) -> str:
        return keys.session(self.store, session_id)

    async def read(self, session_id: str) -> tuple[Entry | None, pb.SessionRecord | None]:
        entry = await self.store.get(self.key(session_id))
        return entry, self.decode(entry) if entry else None

    def decode(self, entry: Entry) -> pb.SessionRecord:
        return self.decoded.decode(entry.key, entry.value)

    def shared(self, entry: Entry) -> pb.SessionRecord:
        """`decode`, once for every watch of the replica: the record is shared, read it only."""
        return self.watched.record(entry.key, entry.mod_revision, entry.value)

    async def require(self, session_id: str) -> tuple[Entry, pb.SessionRecord]:
        entry, record = await self.read(identifiers.check_session_id(session_id))
        if entry is None or record is None:
            raise CoordinatorError(Reason.NOT_FOUND, f"unknown session {session_id}")
        return entry, record

    async def on_latest(self, session_id: str, decide: Decision[T]) -> T | None:
        """`decide(entry, record, reads)` on the record as this replica's own transaction last wrote
        it, when it remembers that (`reads` then compares its bytes too); made again on a fresh read
        when it refuses or loses on the remembered one (coordinator/remembered.py). None: it lost
        its transaction on the fresh read as well."""
        key = self.key(identifiers.check_session_id(session_id))
        entry = self.remembered.get(key)
        if entry is not None:
            # Every refusal, malformed input's too: on a record etcd no longer holds, a fresh read
            # refuses NOT_FOUND first.
            with contextlib.suppress(CoordinatorError, identifiers.InvalidInput):
                decided = await decide(entry, self.decode(entry), [Seen(key, entry, remembered=True)])
                if decided is not None:
                    return decided
        entry, record = await self.require(session_id)
        return await decide(entry, record, [])

    async def transition(
        self,
        entry: Entry | None,
        record: pb.SessionRecord,
        transition: str,
        detail: str = "",
        extra: tuple[Put, ...] = (),
        reads: Sequence[Seen] = (),
    ) -> bool:
        """`transition_entry`, saying only whether the transaction applied."""
        return await self.transition_entry(entry, record, transition, detail, extra, reads) is not None

    async def transition_entry(
        self,
        entry: Entry | None,
        record: pb.SessionRecord,
        transition: str,
        detail: str = "",
        extra: tuple[Put, ...] = (),
        reads: Sequence[Seen] = (),
    ) -> Entry | None:
        """One transaction: the record, its fence key and a history entry, applied only if the record
        (compared on its mod revision, 0 = absent) and every other key the decision read (`reads`)
        are as they were read. Returns the record's new entry, None when the transaction lost."""
        sid = record.session_id
        record.history_seq += 1
        seq = record.history_seq
        history = pb.HistoryEntry(
            seq=seq, at_unix_ms=now_ms(), transition=transition, fence=record.lease.fence, detail=detail[:512]
        )
        puts = [
            Put(self.key(sid), records.encode(record)),
            Put(keys.fence(self.store, sid), fencing.fence_value_of(record).encode()),
            Put(keys.history(self.store, sid, seq), records.encode(history)),
            *extra,
        ]
        # The cap: each transition adds one entry and drops the one HISTORY_KEPT transitions older.
        dropped = [keys.history(self.store, sid, seq - HISTORY_KEPT)] if seq > HISTORY_KEPT else []
        compares = unchanged([Seen(self.key(sid), entry), *reads])
        ok, revision = await self.store.txn(compares, puts, dropped)
        lease = record.lease
        host = lease.owner.host_id or lease.reserved_host_id
        fields = session_fields(sid, lease.fence, host, transition=transition, applied=ok,
                                detail=detail[:200])
        log.info("session %s%s", transition, "" if ok else " lost a race", extra={"fields": fields})
        if not ok:
            self.remembered.lost(self.key(sid))
            return None
        created = entry.create_revision if entry else revision
        written = Entry(self.key(sid), puts[0].value, revision, created, 0)
        self.remembered.wrote(written)
        self.decoded.wrote(written.key, written.value, record)
        return written

    async def probe(self, owner: apb.ProcessIdentity, kill: bool = False) -> tuple[apb.ProbeResult, Seen]:
        """The owner's host's answer (a probe with the tree checked, or a kill), with that host's
        registration as read first: the proof came from the agent it names, so a decision on the
        answer compares it (a heartbeat does not change it; a new registration does)."""
        registration = await self.registry.seen(owner.host_id)
        reg = decode_registration(registration)
        if kill:
            return await self.router.kill(owner, reg, KILL_WAIT_S), registration
        return await self.router.probe(owner, reg, check_tree=True), registration

    async def reservation_unused(self, lease: pb.Lease) -> tuple[apb.ProbeResult, Seen]:
        """The reserved host's answer whether any process carries the reserved token, with that
        host's registration as read first (a grant on the answer compares it)."""
        registration = await self.registry.seen(lease.reserved_host_id)
        return await self.router.reservation_unused(lease, decode_registration(registration)), registration

    async def changed(self, key: str, revision: int, seconds: float) -> None:
        """Returns once the record at `key` changes after `revision`, or after `seconds`: the
        caller reads it again either way. A watcher of the key served from the replica's one watch
        of every session when it can be (no request to etcd), else one on the store's shared watch
        stream; no task of its own (a waiting Acquire costs its call and this watcher). A watch
        from a compacted revision is no change: the key is read again and, while its mod revision is
        still `revision`, watched again from a revision no later than that read's (an Acquire's wait
        on a compacted reservation would otherwise end at once, every time, and its call give up)."""
        start = revision + 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    try:
                        async with contextlib.aclosing(self.store.watch_key(key, start)) as changes:
                            async for _change in changes:
                                break
                        return
                    except Unreached:
                        return  # etcd is behind `revision` (another history): only a fresh read tells
                    except Compacted:
                        # Every revision etcd answered before this linearizable read is at most the
                        # read's own: the key, unchanged there, changed nowhere up to it.
                        seen = self.store.newest
                        now = await self.store.get(key)
                        if now is None or now.mod_revision != revision:
                            return
                        start = max(start, seen + 1)

    async def wait_exit(self, owner: apb.ProcessIdentity,
                        seconds: float) -> tuple[apb.ProbeResult | None, Seen]:
        """The owner's exit event with its tree checked (None: none within `seconds`), with the
        registration of the agent it came from, as read first: a decision on it compares it."""
        registration = await self.registry.seen(owner.host_id)
        return await self.router.wait_exit(owner, decode_registration(registration), seconds), registration

    async def judge_probed(
        self, record: pb.SessionRecord
    ) -> tuple[adjudication.Verdict, apb.ProbeResult | None, list[Seen]]:
        """Adjudicate as the handoff's requester would be, probing a committed owner's own host;
        with the keys the verdict read besides the record (the owner host's registration)."""
        ask = AcquireAsk(None, record.lease.handoff_operation_hash)
        probe, reads = None, []
        if record.lease.claim_status in (pb.COMMITTED, pb.LIVE, pb.CONFLICTED) and record.lease.owner.host_id:
            probe, registration = await self.probe(record.lease.owner)
            reads.append(registration)
        return adjudication.adjudicate(record, ask, probe, now_ms()), probe, reads
