"""Acquire: one call's way from its request to a grant or a refusal, as an `Acquisition` holding the
call's state (the ask, its operation's replay key, the deadline, the owner whose exit ended the
last wait, the HELD verdict a wait began on, the attested gate), one method per phase: read,
attest, ask the owner, wait for the exit, grant.

Guarantee: only a grant mints a fence, token and secret, in one transaction comparing every key
the decision read (the record, the replay, the revival keys, the grant's gates, the probed owner's
registration, the cluster identity); a refusal writes nothing and signals nothing (a forced Acquire
kills only after a `force-pending` transition comparing every precondition of the grant; a gate is
attested before anything is decided, written or signalled); indeterminate never grants; a lost
race re-reads and decides again, at most RACE_RETRIES times. A first pass with no read round trip,
on the record as this replica's own transaction last wrote it (`remembered_reads`), may only grant:
its transaction compares that record's bytes and every key it took as absent, and anything else —
a refusal, a wait, a probe, a lost transaction — is decided again on a fresh read.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace

import grpc

from holdfast.common import identifiers, tls
from holdfast.common.reasons import Reason
from holdfast.coordinator import (
    adjudication,
    attestation,
    fencing,
    grant_gates,
    keys,
    metrics,
    protojson,
    records,
)
from holdfast.coordinator.adjudication import AcquireAsk, Action
from holdfast.coordinator.cluster import ClusterIdentity
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.grant_gates import GrantGates
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.replays import ReplayLease
from holdfast.coordinator.reservations import ReservationClock, window_s
from holdfast.coordinator.revival import archived_record, revival_keys, revived
from holdfast.coordinator.routing import Router
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import Entry, Put, Seen, Store
from holdfast.coordinator.tenancy import Caller, Tenancy
from holdfast.proc.ending import KILL_WAIT_S
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

RACE_RETRIES = 16
# What a forced Acquire refused after its kill was asked has done, and how it goes on.
FORCE_STANDS = ("This forced takeover's kill was asked: its force-pending record stands for this operation "
                "and the owner's agent may have ended the tree. Retrying the same takeover (the same "
                "operation id, which `run --takeover --force` keeps until granted) continues it: the kill "
                "is asked again, and the grant follows only the agent's proof that the tree is gone")


def caller_of(context: grpc.aio.ServicerContext, host_id: str, caller: Caller) -> str:
    """Whose operation an id is, so that its replayed grant, secret included, goes back to that caller
    alone: the peer's address (without its ephemeral port), the host id it names and its
    certificate's identity (role, name, tenant; "plaintext" without mTLS). The address alone let
    another certificate on the same machine that learned the id take the grant."""
    return f"{context.peer().rsplit(':', 1)[0]}|{host_id}|{caller.who}"


def op_hash(rpc: str, caller: str, operation_id: str) -> str:
    return hashlib.sha256(f"{rpc}\0{caller}\0{operation_id}".encode()).hexdigest()


def handoff_hash(operation_id: str) -> str:
    """What a record keeps of the operation that asked for its handoff (never the id itself)."""
    return hashlib.sha256(f"handoff\0{operation_id}".encode()).hexdigest()


def is_operator(context: grpc.aio.ServicerContext) -> bool:
    """The verified peer certificate says operator (never a claim in the request)."""
    role = tls.peer_role(context)
    return role is not None and role.kind == "operator"


@dataclass(frozen=True)
class Exited:
    """An owner whose exit event ended a wait, with what its agent answered (the event's result, or
    a probe's; None: no event came) and the registration of that agent, compared by a decision
    that uses the answer. `wait_reads`: the reads the wait began on (the grant's gates, then the replay,
    the record as read or as this call wrote it, the revival keys), which a grant on the event's
    proof may rest on instead of a re-read."""

    owner: apb.ProcessIdentity
    result: apb.ProbeResult | None
    registration: Seen
    wait_reads: tuple[GrantGates, list[Seen]] | None = None


@dataclass(frozen=True)
class Reading:
    """What one pass decides on: the grant's gates; this operation's replay, the record and what a
    new record's first fence rests on (the revival keys), each compared by the grant; the exit that
    ended the last wait, with its proof; and whether the reads are held, not made now (no round
    trip), which only a grant may rest on."""

    gates: GrantGates
    replay: Seen
    record: Seen
    revival: list[Seen]
    woken_by: Exited | None
    held: bool

    @classmethod
    def of(cls, gates: GrantGates, keys_read: list[Seen], woken_by: Exited | None, held: bool) -> Reading:
        """From `grant_gates.read`'s keys: the replay, the record, then the revival keys."""
        replay, record, *revival = keys_read
        return cls(gates, replay, record, revival, woken_by, held)

    def began_on(self, entry: Entry | None) -> list[Seen]:
        """The keys a wait begins on, with the record as this pass last wrote it: a grant on the
        wait's own proof may rest on them instead of a re-read (its transaction compares each)."""
        return [self.replay, Seen(self.record.key, entry), *self.revival]


class Reread(Exception):
    """This pass decides nothing more: a transaction lost, a wait ended, or held reads led to
    anything but a grant. The next pass reads (afresh, or the reads its wait began on) and decides
    again."""


@dataclass(frozen=True)
class Parts:
    """What every Acquire works with, made once by the service."""

    store: Store
    registry: Registry
    router: Router
    sessions: Sessions
    replays: ReplayLease
    cluster: ClusterIdentity
    tenancy: Tenancy
    reservations: ReservationClock
    commit_window_ms: int


def check(request: pb.AcquireRequest) -> str:
    """The request whole, before anything is read: the session id, or InvalidInput."""
    sid = identifiers.check_session_id(request.session_id)
    identifiers.check_operation_id(request.operation_id)
    identifiers.check_host_id(request.host_id)
    identifiers.check_acquire_texts(request.provider, request.location)
    if request.has_expected_fence and request.expected_fence > identifiers.MAX_FENCE:
        raise identifiers.InvalidInput("expected fence out of range")
    if not 0 <= request.wait_seconds <= 3600:
        raise identifiers.InvalidInput("wait_seconds must be in 0..3600")
    identifiers.check_acquire_flags(request.force, request.await_release)
    return sid


class Acquisition:
    """One Acquire call."""

    def __init__(self, parts: Parts, request: pb.AcquireRequest, context: grpc.aio.ServicerContext) -> None:
        self.parts = parts
        self.request = request
        self.context = context
        self.sid = check(request)
        self.gate_token = attestation.check_gate(request.gate) if request.HasField("gate") else ""
        self.caller = parts.tenancy.caller(context)
        self.attested: attestation.Attested | None = None
        ohash = op_hash("Acquire", caller_of(context, request.host_id, self.caller), request.operation_id)
        self.ops_key = keys.op(parts.store, self.sid, ohash)
        self.ask = AcquireAsk(
            request.expected_fence if request.has_expected_fence else None, handoff_hash(request.operation_id)
        )
        self.started = time.monotonic()
        self.deadline = self.started + request.wait_seconds
        self.last_held: adjudication.Verdict | None = None  # the HELD verdict the last wait began on
        self.exited: Exited | None = None  # the owner whose exit event ended the last wait
        self.races = 0  # passes that read and lost, or decided again; a reservation's wait is none
        self.killed = False  # a forced Acquire's kill was asked: a refusal says so
        self.waited_after_kill = False  # the one wait on the owner's exit a kill's unproven answer gets

    async def run(self) -> pb.AcquireResponse:
        """`passes`; a refusal after this call's kill was asked says so (the one refusal of a forced
        Acquire that has written and signalled, docs/guarantees.md 3)."""
        try:
            return await self.passes()
        except CoordinatorError as err:
            if not self.killed:
                raise
            raise CoordinatorError(err.reason, f"{err.message}. {FORCE_STANDS}") from None

    async def passes(self) -> pb.AcquireResponse:
        """Passes of reading and deciding until one grants or refuses; a pass that lost a race,
        waited, or read what only a grant may rest on ends in `Reread`. At most RACE_RETRIES races:
        a reservation's wait is none (the deadline bounds the waits)."""
        first = True
        while self.races < RACE_RETRIES:
            self.races += 1
            reading = await self.read(first=first)
            first = False
            self.exited = None
            try:
                return await self.decide(reading)
            except Reread:
                continue
        if self.last_held is not None:
            raise CoordinatorError(self.last_held.reason, self.last_held.detail)
        raise CoordinatorError(Reason.STALE_FENCE, "lost every race for this session; retry")

    async def decide(self, reading: Reading) -> pb.AcquireResponse:
        """One pass: the grant, or a refusal (raised), or `Reread`."""
        request, entry = self.request, reading.record.entry
        record = self.parts.sessions.decode(entry) if entry is not None else None
        stored = self.admit(reading, entry, record)
        if stored is not None:
            return stored
        verdict = adjudication.adjudicate(record, self.ask, None, now_ms())
        # A remembered record is compared on its bytes too: the transition's own compare of the
        # record is on its mod revision alone.
        reads = [reading.replay, reading.record] if reading.record.remembered else [reading.replay]
        if verdict.reason is Reason.RESERVED and record is not None and entry is not None:
            verdict = await self.question_reservation(entry, record, verdict, reads)
        if self.gate_token and self.attested is None and verdict.action in (Action.GRANT, Action.PROBE):
            # Before anything is decided, written or signalled: a gate that cannot be attested
            # refuses here with nothing done, never after a force-pending write or a kill; on
            # held reads, which only a grant may rest on, a fresh read decides instead.
            try:
                self.attested = await self.attest(record, reading.gates)
            except CoordinatorError:
                if reading.held:
                    raise Reread from None
                raise
        if verdict.action is Action.PROBE and record is not None:
            entry = await self.take_from_owner(entry, record, reading)
            verdict = await self.probe_owner(record, reading.woken_by, reads)
        if reading.held and (verdict.action is not Action.GRANT or request.await_release):
            # Decided on reads held, not made now (this replica's own writes, or those a wait
            # began on): only a grant may rest on them (its transaction compares each one).
            # Anything else is decided again on a fresh read, having written and signalled nothing.
            self.exited = replace(reading.woken_by, wait_reads=None) if reading.woken_by is not None else None
            raise Reread
        metrics.INDETERMINATE.verdict(self.sid, verdict.reason.value)
        await self.wait_or_refuse(verdict, entry, record, reading, reads)
        response = await self.grant(entry, record, verdict, reading.gates, reads, reading.revival)
        if response is None:
            raise Reread
        if request.takeover or verdict.reason is adjudication.Reason.OWNER_DEAD:
            metrics.TAKEOVER_SECONDS.labels(verdict.reason.value).observe(time.monotonic() - self.started)
        return response

    def admit(self, reading: Reading, entry: Entry | None,
              record: pb.SessionRecord | None) -> pb.AcquireResponse | None:
        """On every reading, before anything is decided, asked or written: refuses another tenant's
        id and a record too large to grant; returns this operation's grant when it was made already."""
        # The id may have been made by another tenant since the last reading (the grant compares
        # it read absent).
        of_id = record or archived_record(reading.revival[0])
        self.parts.tenancy.judge("Acquire", self.sid, of_id, self.caller)
        if entry is not None and not records.grant_fits(len(entry.value), reading.record.remembered):
            # Before anything is asked, probed, written or signalled: a grant that etcd would
            # refuse by its size must not first ask the owner to end or kill it.
            raise CoordinatorError(Reason.RECORD_TOO_LARGE, f"the session's record is {len(entry.value)} "
                                   f"bytes: a grant of it passes etcd's request limit of "
                                   f"{records.ETCD_REQUEST_LIMIT_BYTES} bytes; nothing was written")
        if reading.replay.entry is None:
            return None
        # This operation was granted already (an earlier try, or the same call racing itself).
        stored = protojson.parse(reading.replay.entry.value, pb.AcquireResponse)
        if adjudication.replay_still_valid(stored.grant.fence, record):
            return stored
        if not adjudication.replay_released(stored.grant.fence, record):
            raise CoordinatorError(Reason.STALE_FENCE, "the fence has moved since this operation's grant")
        return None

    async def take_from_owner(self, entry: Entry | None, record: pb.SessionRecord,
                              reading: Reading) -> Entry | None:
        """Before a live owner is probed: a forced Acquire's force-pending write, or a takeover's
        request to the owner, waited on by its exit stream. Returns the record's entry as this pass
        last wrote it; `Reread` when a transaction lost or the owner's exit was waited for."""
        request = self.request
        if request.force:
            # The kill is authorised only by a force-pending transaction comparing every
            # precondition of the grant; until it lands, nothing is signalled.
            written = await self.force_pending(entry, record)
            if written is None:
                raise Reread  # the record or a precondition changed: re-read, re-decide
            return written
        if not (request.takeover and adjudication.ask_owner(record.lease, self.ask.operation_hash,
                                                            request.host_id)):
            return entry
        # The owner is asked to let go by the takeover itself, once its gate is attested and every
        # gate of the grant is open: a takeover refused up to here asked nothing of anyone, and the
        # owner's ending overlaps no second round trip. Its exit stream is opened beside the
        # request's transaction, so it is armed (a pidfd on the owner) before the owner can hear the
        # request: opened after, it would add 1-5 ms to every handoff. The stream reads and signals
        # nothing: a request that loses or is refused drops it, having asked nothing of anyone.
        remaining = self.deadline - time.monotonic()
        watch = (asyncio.ensure_future(self.parts.sessions.wait_exit(record.lease.owner, remaining))
                 if remaining > 0 else None)
        try:
            written = await self.ask_owner(entry, record, reading.gates, reading.replay)
            if written is None:
                raise Reread
            if watch is not None:
                # Just asked, it is ending: a probe now would find it alive. Its exit is waited for
                # instead, on the record as this transaction wrote it.
                self.exited = await self.wait_exit(record.lease.owner, watch, reading.gates,
                                                   reading.began_on(written))
                raise Reread
            return written
        finally:
            if watch is not None:
                watch.cancel()

    async def probe_owner(self, record: pb.SessionRecord, woken_by: Exited | None,
                          reads: list[Seen]) -> adjudication.Verdict:
        """The owner's agent's answer (the exit event's, when a wait ended on this very owner), its
        registration appended to `reads`, and the verdict on it."""
        if woken_by is not None and woken_by.result is not None and woken_by.owner == record.lease.owner:
            probe, registration = woken_by.result, woken_by.registration
        else:
            self.killed = self.killed or self.request.force
            probe, registration = await self.parts.sessions.probe(record.lease.owner, kill=self.request.force)
        reads.append(registration)
        return adjudication.adjudicate(record, self.ask, probe, now_ms())

    async def wait_or_refuse(self, verdict: adjudication.Verdict, entry: Entry | None,
                             record: pb.SessionRecord | None, reading: Reading, reads: list[Seen]) -> None:
        """Returns only for a grant; else refuses (raised), or waits — with `--wait` time left, on a
        reservation or a live owner — and ends in `Reread`. `reads`: what the verdict rests on."""
        parts = self.parts
        if verdict.action is Action.TO_MANUAL and record is not None:
            record.lease.handoff_stage = pb.MANUAL_RECOVERY
            await parts.sessions.transition(entry, record, "manual-recovery", verdict.detail,
                                            reads=reads)
            raise CoordinatorError(Reason.MANUAL_RECOVERY, f"{verdict.detail}; the record was moved to "
                                   "manual recovery (written: only Recover leaves it)")
        remaining = self.deadline - time.monotonic()
        if verdict.reason is Reason.RESERVED and remaining > 0 and record is not None and entry is not None:
            # --wait: until the record changes (the reservation commits or goes) or this replica
            # may ask about it (again, half a window after an answer that left it), then decide again.
            pause = (parts.reservations.wait_s(entry.key, entry.mod_revision, record.lease)
                     or window_s(record.lease) / 2)
            with metrics.ACQUIRES_WAITING.track_inprogress():
                await parts.sessions.changed(entry.key, entry.mod_revision, min(pause, remaining))
            self.races -= 1  # a wait is no lost race: the deadline bounds the waits, RACE_RETRIES the races
            raise Reread
        if (self.killed and not self.waited_after_kill and remaining > 0 and record is not None
                and verdict.action is Action.REFUSE
                and verdict.reason in (Reason.OWNERSHIP_UNKNOWN, Reason.TREE_ALIVE, Reason.HELD)):
            # The kill's answer proved no end (none in time, the tree not yet proven gone, the root
            # still alive): with `wait_seconds` left it is not refused at once. Once, the owner's
            # exit is waited for (at most a kill's own wait), then the forced pass runs again — its
            # force-pending transition comparing every precondition afresh, the kill asked again —
            # and that answer decides. Never a grant without the agent's proof.
            self.waited_after_kill = True
            with metrics.ACQUIRES_WAITING.track_inprogress():
                await parts.sessions.wait_exit(record.lease.owner, min(remaining, KILL_WAIT_S))
            raise Reread
        if (verdict.reason is adjudication.Reason.HELD and remaining > 0 and record is not None
                and not self.request.force):
            self.last_held = verdict
            # --wait: hold the call open on the owner host's exit stream, then adjudicate afresh.
            self.exited = await self.wait_exit(record.lease.owner,
                                               parts.sessions.wait_exit(record.lease.owner, remaining),
                                               reading.gates, reading.began_on(entry))
            raise Reread
        if verdict.action is not Action.GRANT:
            raise CoordinatorError(verdict.reason, verdict.detail)
        if (self.request.await_release and verdict.reason is adjudication.Reason.OWNER_DEAD
                and record is not None and record.lease.claim_status in (pb.COMMITTED, pb.LIVE)):
            # Decided on the record as read: a release landing after this read is the next call's.
            raise CoordinatorError(Reason.RELEASE_PENDING, f"the owner at fence {record.lease.fence} has "
                                   f"ended ({verdict.detail}) but has not released; nothing was granted")

    async def question_reservation(self, entry: Entry, record: pb.SessionRecord,
                                   refused: adjudication.Verdict, reads: list[Seen]) -> adjudication.Verdict:
        """A reservation this replica has seen for half its window, on its own monotonic clock
        (coordinator/reservations.py), is asked about: its host's agent's complete answer that no
        process carries the reserved token supersedes it (the grant compares that agent's
        registration, appended to `reads`); any other answer leaves it RESERVED. Sooner, it stays."""
        lease = record.lease
        if self.parts.reservations.wait_s(entry.key, entry.mod_revision, lease) > 0:
            return refused
        probe, registration = await self.parts.sessions.reservation_unused(lease)
        reads.append(registration)
        return adjudication.adjudicate(record, self.ask, probe, now_ms())

    # --- read -------------------------------------------------------------------------------
    async def read(self, first: bool) -> Reading:
        """Everything a decision reads, in one round trip at one revision: the grant's gates, then
        this operation's replay, the record and what a new record's first fence rests on, each
        compared in the grant's transaction. After a wait ended by an owner's exit event, that
        owner's proof comes with the read: the event's own when its agent proved the tree gone with
        it, else a probe beside the read (never a kill). Either proves the same whichever lands
        first, the grant still follows both, and it is used only if the record still names that
        owner. Last, whether the reads are held, not made now, with no round trip: on the `first`
        pass, what this replica holds (`remembered_reads`); with the event's own proof, those the
        wait began on. A grant may rest on held reads, nothing else (`run` decides anything else
        on a fresh read)."""
        exited = self.exited
        if exited is None or self.request.force:
            if first and (remembered := self.remembered_reads()) is not None:
                return Reading.of(*remembered, None, True)
            return Reading.of(*await self._read_keys(), None, False)
        if exited.result is not None and adjudication.proves_gone(exited.result):
            if exited.wait_reads is not None:
                # No round trip: the grant that may follow compares every one of these keys in its
                # transaction, so a change since they were read makes it lose (and the next pass
                # reads afresh); it can grant nothing a fresh read would refuse.
                return Reading.of(*exited.wait_reads, exited, True)
            return Reading.of(*await self._read_keys(), exited, False)
        (gates, keys_read), (probe, registration) = await asyncio.gather(
            self._read_keys(), self.parts.sessions.probe(exited.owner))
        return Reading.of(gates, keys_read, Exited(exited.owner, probe, registration), False)

    def remembered_reads(self) -> tuple[GrantGates, list[Seen]] | None:
        """`_read_keys`' answer as this replica holds it, when a grant may follow it without asking
        anyone: the record as this replica's own transaction last wrote it (coordinator/remembered.py:
        a session acquired again after this replica's Release), with no claim on it and of the
        caller's tenant; the gates `taken_open`; this operation's replay key absent (a new operation;
        a retry's key makes the grant lose, and the fresh read replays it); the revival keys absent,
        unused beside a record. None — read them — for no such record, a claim (it is probed or
        questioned: asked only on a fresh read), or a registration the cache does not hold.
        It cannot grant anything a fresh read would refuse: the grant compares each of these reads —
        the record on its mod revision and bytes, the registration on its mod revision, every key
        taken as absent as absent — so it applies only while etcd holds what a fresh read would have
        returned, on which the same decision is made; anything but a grant `run` decides afresh."""
        parts = self.parts
        key = parts.sessions.key(self.sid)
        entry = parts.sessions.remembered.get(key)
        gates = grant_gates.taken_open(parts.store, parts.registry, self.request.host_id)
        if entry is None or gates is None:
            return None
        record = parts.sessions.decode(entry)
        if adjudication.has_claim(record.lease) or not parts.tenancy.allows(self.caller, record):
            return None
        absent = [Seen(k, None) for k in (self.ops_key, *revival_keys(parts.store, self.sid))]
        return gates, [absent[0], Seen(key, entry, remembered=True), *absent[1:]]

    async def _read_keys(self) -> tuple[GrantGates, list[Seen]]:
        parts, sid = self.parts, self.sid
        return await grant_gates.read(parts.store, parts.registry, self.request.host_id, self.ops_key,
                                      parts.sessions.key(sid), *revival_keys(parts.store, sid))

    # --- attest -----------------------------------------------------------------------------
    async def attest(self, record: pb.SessionRecord | None, gates: GrantGates) -> attestation.Attested | None:
        """The caller's gate attested by its host's agent, in a session cgroup named for the fence
        the grant would have now; None when the gate's token is not under the variable that host's
        agent reads (the grant is then a reservation, committed by CommitOwner as before)."""
        request = self.request
        host = gates.judge()
        if host.spawn_token_env != request.gate.spawn_token_env:
            return None
        fence = fencing.next_fence(record.lease.fence, record.lease.minimum_next_fence) if record else 1
        return await attestation.attest(self.parts.router, request.host_id, gates.registration,
                                        self.gate_token, host.spawn_token_env, request.gate.pid_hint,
                                        request.session_id, fence)

    # --- ask the owner ------------------------------------------------------------------------
    async def force_pending(self, entry: Entry | None, record: pb.SessionRecord) -> Entry | None:
        """Authorises a forced Acquire's kill: refuses (writing nothing) unless this caller's
        handoff request is the record's, or the peer is an operator, and unless every gate of the
        grant is open; then one transaction marks the record force-pending, comparing the record
        (adjudicated already: stale fence, manual recovery, another operation's request) and every
        gate it read. Returns the force-pending record's entry, None when that transaction lost."""
        request, parts = self.request, self.parts
        if not adjudication.force_allowed(record.lease, self.ask, is_operator(self.context)):
            raise CoordinatorError(Reason.FORCE_NOT_ALLOWED, "force is honoured only for the caller whose "
                                   "handoff request the record holds (run --takeover --force) or an operator")
        gates, _ = await grant_gates.read(parts.store, parts.registry, request.host_id)
        gates.judge()
        lease = record.lease
        lease.handoff_stage = pb.FORCE_PENDING
        lease.handoff_operation_hash = self.ask.operation_hash
        lease.handoff_requested_by_host = request.host_id
        return await parts.sessions.transition_entry(entry, record, "force-pending", request.host_id,
                                                  reads=gates.reads)

    async def ask_owner(self, entry: Entry | None, record: pb.SessionRecord, gates: GrantGates,
                        replay: Seen) -> Entry | None:
        """Writes a takeover's handoff request (`record` marked by `adjudication.ask_owner`),
        comparing the record, the grant's gates and this operation's replay key (read absent: a
        grant of this very operation meanwhile must not be asked to end); returns the record's new
        entry, None when the transaction lost. Refuses (writing nothing) when a gate is closed."""
        gates.judge()
        return await self.parts.sessions.transition_entry(entry, record, "handoff-requested", gates.host_id,
                                                       reads=[replay, *gates.reads])

    # --- wait for the exit ----------------------------------------------------------------------
    async def wait_exit(self, owner: apb.ProcessIdentity,
                        waiting: Awaitable[tuple[apb.ProbeResult | None, Seen]], gates: GrantGates,
                        keys_read: list[Seen]) -> Exited:
        """Until `waiting` (the owner's exit stream, `sessions.wait_exit`, begun by the caller) has
        the owner's first exit event or runs out; proves nothing by itself. Returns the owner and
        the event, with the reads the wait began on."""
        with metrics.ACQUIRES_WAITING.track_inprogress():
            return Exited(owner, *await waiting, wait_reads=(gates, keys_read))

    # --- grant --------------------------------------------------------------------------------
    async def grant(self, entry: Entry | None, record: pb.SessionRecord | None,
                    verdict: adjudication.Verdict, gates: GrantGates, reads: Sequence[Seen],
                    revival: list[Seen]) -> pb.AcquireResponse | None:
        """The grant transaction, comparing the record, what the verdict read (the owner host's
        registration when probed), the grant's gates and, for an id with no record, the archive
        record and floor its first fence came from (`revival`, read with the record). With an
        attested gate whose registration is still the one read, the gate is the owner in the same
        transaction (commit at grant); else the grant is a reservation. None when it lost a race."""
        request, parts, attested = self.request, self.parts, self.attested
        host = gates.judge()
        cluster_id, cluster_reads, cluster_puts = await parts.cluster.for_grant()
        reads = [*reads, *gates.reads, *cluster_reads]
        if record is None:
            record = revived(request.session_id, request.provider, request.location, *revival)
            record.tenant = record.tenant or self.caller.tenant  # a revived id stays its tenant's
            reads += revival
        old = record.lease
        secret, at = fencing.mint_grant_secret(), now_ms()
        # A gate's token is its own (its run minted the secret it derives from); else a fresh one.
        token = self.gate_token or fencing.mint_spawn_token()
        lease = pb.Lease(
            fence=fencing.next_fence(old.fence, old.minimum_next_fence),
            minimum_next_fence=old.minimum_next_fence,
            claim_status=pb.RESERVED,
            handoff_stage=pb.NONE,
            reserved_spawn_token=token,
            spawn_token_env=host.spawn_token_env,
            reserved_host_id=request.host_id,
            reserved_at_unix_ms=at,
            commit_deadline_unix_ms=at + parts.commit_window_ms,
            live_on_commit=request.live_on_commit,
            grant_secret_hash=fencing.hash_secret(secret),
            last_proven_alive_at_unix_ms=old.last_proven_alive_at_unix_ms,
        )
        lease.death_evidence.CopyFrom(verdict.evidence or old.death_evidence)
        detail = verdict.reason.value
        if attested is not None and attested.current(gates.registration):
            attestation.commit(lease, attested.identity, at)
            detail += f"; committed pid {attested.identity.pid} on {attested.identity.host_id}"
        record.lease.CopyFrom(lease)
        grant = pb.Grant(
            session_id=record.session_id,
            fence=lease.fence,
            secret=secret,
            spawn_token=token,
            spawn_token_env=lease.spawn_token_env,
            commit_deadline_unix_ms=lease.commit_deadline_unix_ms,
            cluster_id=cluster_id,
        )
        response = pb.AcquireResponse(grant=grant, record=record)
        replay_lease = await parts.replays.current()
        stored = Put(self.ops_key, records.encode(response), replay_lease)
        try:
            written = await parts.sessions.transition_entry(entry, record, "grant", detail,
                                                            (stored, *cluster_puts), reads)
        except grpc.aio.AioRpcError as exc:
            if not parts.replays.lost(exc, replay_lease):
                raise
            return None  # nothing was written; the caller's next attempt uses a new lease
        if written is None:
            return None
        metrics.GRANTS.labels(verdict.reason.value).inc()
        response.revision = written.mod_revision  # not in the replay record: its own txn writes it
        return response
