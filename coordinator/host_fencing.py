"""Fencing a lost host, then freeing its sessions (docs/operations.md, *A lost host is fenced*).

A loop on every replica notes, on its own monotonic clock, when it first saw a host that some
session names (as owner or reservation) without a registration. Once that has lasted
`host_loss_after` — time only triggers — it starts that host's attempt as a task of its own (at
most one per host, PARALLEL_ATTEMPTS at once, the passes going on), which creates
`fence-pending/<host>` in a transaction that compares the host's registration absent, its
registered-last (`host-last/<host>`), the drain flag, the restore gate, any earlier proof and the
next history slot, runs the configured fence agent (`off`, then `status`), and ends the attempt in
a transaction comparing the pending key's revision: on proof it writes `fenced/<host>`; on
anything else it writes only the attempt to the host's history, alerts, and retries with backoff.
After a proof, each owner attested on the fenced incarnation and each reservation on the host
written before it is freed in its own transaction, comparing its record and the proof's revision,
with `host-fenced` evidence.

Guarantee: nothing is freed but on the protocol's proof (holdfast.coordinator.fence_rules); a
registered host is never fenced, nor a draining or restore-gated one but by an operator's hand;
one attempt at a time across replicas (the pending key is create-only, and RegisterHost refuses
while it exists); an attempt that is not proof leaves every session record byte-identical; a
replica that dies mid-attempt leaves a pending key whose lease lapses after the attempt's timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from holdfast.common import identifiers
from holdfast.common.reasons import Reason
from holdfast.coordinator import fence_rules, fencers, keys, metrics, protojson, records
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.fence_rules import Answer, FencerSpec, Gates
from holdfast.coordinator.lifecycle import Lifecycle, operator_text
from holdfast.coordinator.sessions import now_ms
from holdfast.coordinator.store import Entry, Put, Seen, StoreUnavailable, absent, unchanged
from holdfast.v1 import coordinator_pb2 as pb

log = logging.getLogger("holdfast.coordinator.fencing")
HISTORY_KEPT = 32
PENDING_SLACK_S = 30.0
PARALLEL_ATTEMPTS = 8  # hosts a replica's loop fences (or reads the Node of) at once
M = TypeVar("M", bound=Message)  # the pending key outlives both actions' timeouts by this much


@dataclass(frozen=True)
class FencingSettings:
    fencers: tuple[FencerSpec, ...] = ()
    host_loss_after: float = 60.0
    timeout: float = 60.0
    retry_first: float = 10.0
    node_readers: fencers.NodeReaders | None = None  # the taint fencer's API client (None: none)

    @property
    def interval(self) -> float:
        """How often a replica looks: a twentieth of `host_loss_after`, within 0.1..1 s (a pass with
        every host registered reads two small listings)."""
        return min(max(self.host_loss_after / 20, 0.1), 1.0)


@dataclass
class Absence:
    """When this replica first saw a host's registration absent, under which registered-last, and
    what its reads of the host's Node have found since (the taint fencer's only evidence of order)."""

    since: float        # monotonic
    since_unix_ms: int  # the same instant on the wall clock, for people
    last_revision: int  # host-last's mod revision then: a registration since restarts the clock
    sightings: fence_rules.TaintSightings = field(default_factory=fence_rules.TaintSightings)
    look_at: float = 0.0  # monotonic: the Node is not read for it again before


class HostFencing:
    def __init__(self, lifecycle: Lifecycle, settings: FencingSettings, coordinator: str) -> None:
        self.lifecycle = lifecycle
        self.sessions = lifecycle.sessions
        self.store = lifecycle.store
        self.settings = settings
        self.coordinator = coordinator
        self.absent: dict[str, Absence] = {}
        self.retry_at: dict[str, float] = {}      # monotonic: no automatic attempt before
        self.failure_seen: dict[str, str] = {}    # the last unproven attempt's history key backed off for
        self.unfenceable: dict[str, str] = {}     # why a host is not fenced, logged once per reason
        self.unnamed: dict[str, int] = {}         # absent hosts no session names, by host-last revision
        self.lost: set[str] = set()               # absent hosts sessions name: candidates for a fence
        self.by_hand: set[asyncio.Task[pb.FenceHostResponse | None]] = set()  # held while they run
        self.attending: dict[str, asyncio.Task[None]] = {}  # the loop's look or attempt per host, running
        self.parallel = asyncio.Semaphore(PARALLEL_ATTEMPTS)

    # --- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Until cancelled: one pass every `interval`; an etcd outage only delays the next pass."""
        try:
            while True:
                try:
                    await self.pass_once()
                except StoreUnavailable as exc:
                    metrics.ETCD_ERRORS.labels("host-fencing").inc()
                    log.warning("host fencing pass skipped: %s", exc)
                except Exception:  # a bug must not end fencing for good: logged, and the next pass runs
                    log.exception("host fencing pass failed")
                await asyncio.sleep(self.settings.interval)
        finally:  # the loop's attempts end with it, as they did when it awaited them
            attending = list(self.attending.values())
            for task in attending:
                task.cancel()
            await asyncio.gather(*attending, return_exceptions=True)

    async def pass_once(self) -> None:
        """One look: which hosts that ever registered have no registration now (two small listings,
        the whole pass when every host is registered); only while one of them may be named by a
        session are the sessions read, to fence what is due and free what a proof covers."""
        lasts, _ = await self.store.list_prefix(keys.host_last_prefix(self.store))
        registered = {host.host_id for host in await self.sessions.registry.list()}
        missing = {_host_of(e.key): e.mod_revision for e in lasts if _host_of(e.key) not in registered}
        self._note_absences(missing)
        named: set[str] = set()
        if any(self.unnamed.get(host_id) != revision for host_id, revision in missing.items()):
            claims = await self.lifecycle.all_sessions()
            named = fence_rules.hosts_named(record for _, record in claims) & set(missing)
            # An absent host no session names stays so until it registers again (a grant to it needs
            # its registration): the sessions are not read again for it until its host-last moves.
            self.unnamed = {h: r for h, r in missing.items() if h not in named}
            await self._recover_proven(claims, missing)
        now = time.monotonic()
        for host_id in sorted(named):
            absence = self.absent[host_id]
            metrics.HOST_ABSENT_SECONDS.labels(host_id).set(fence_rules.lost_for(absence.since, now))
            if host_id in self.attending:
                continue  # at most one look or attempt per host in flight on this replica
            look = self._look_due(host_id, absence, now)
            if look or fence_rules.due(absence.since, now, self.settings.host_loss_after,
                                       self.retry_at.get(host_id)):
                task = asyncio.create_task(self._attend(host_id, absence, look, now))
                self.attending[host_id] = task
                task.add_done_callback(self._attended)
        for host_id in set(self.lost) - named:
            metrics.HOST_ABSENT_SECONDS.remove(host_id)
        self.lost = named

    def _attended(self, task: asyncio.Task[None]) -> None:
        self.attending = {host: t for host, t in self.attending.items() if t is not task}

    async def _attend(self, host_id: str, absence: Absence, look: bool, now: float) -> None:
        """One host's look at its Node and, when due, its fence, as a task of its own: a device that
        hangs to its timeout holds back no other host's fence, and the passes go on meanwhile. At
        most PARALLEL_ATTEMPTS run at once on a replica; each ends by its own timeouts."""
        try:
            async with self.parallel:
                if look:
                    await self._look_at_node(host_id, absence, now)
                if fence_rules.due(absence.since, time.monotonic(), self.settings.host_loss_after,
                                   self.retry_at.get(host_id)):
                    await self.fence(host_id, fence_rules.HOST_LOST)
        except StoreUnavailable as exc:
            metrics.ETCD_ERRORS.labels("host-fencing").inc()
            log.warning("host %s: fencing skipped: %s", host_id, exc, extra={"fields": {"host": host_id}})
        except Exception:  # a bug must not end this host's fencing for good: the next pass tries again
            log.exception("host %s: fencing failed", host_id, extra={"fields": {"host": host_id}})

    async def _recover_proven(self, claims: list[tuple[Entry, pb.SessionRecord]],
                              missing: dict[str, int]) -> None:
        """What a proof covers and is not freed yet (a record that lost a race, a replica that died
        between the proof and the recovery) is freed on a later pass, by any replica, while the host
        has not registered again; what it does not cover (a new incarnation's owners) never is."""
        proofs, _ = await self.store.list_prefix(keys.fenced_prefix(self.store))
        for proof in proofs:
            host_id = _host_of(proof.key)
            fenced = protojson.parse(proof.value, pb.FenceAttempt)
            if host_id in missing and any(
                    fence_rules.recoverable(record, host_id, fenced, entry.mod_revision, proof.mod_revision)
                    for entry, record in claims):
                await self.recover(host_id)

    def _note_absences(self, missing: dict[str, int]) -> None:
        """Starts (or restarts) this replica's clock of each missing host: a registration between two
        passes shows as a new registered-last revision."""
        now, wall = time.monotonic(), now_ms()
        for host_id, revision in missing.items():
            seen = self.absent.get(host_id)
            if seen is None or seen.last_revision != revision:
                self.absent[host_id] = Absence(now, wall, revision)
        for host_id in set(self.absent) - set(missing):
            del self.absent[host_id]

    def _look_due(self, host_id: str, absence: Absence, now: float) -> bool:
        """The taint fencer's host whose Node no read since the lapse has answered, past any wait."""
        spec = fence_rules.fencer_for(self.settings.fencers, host_id)
        return (spec is not None and spec.kind == fence_rules.KUBERNETES and self.settings.node_readers
                is not None and not absence.sightings.looked and now >= absence.look_at)

    async def _look_at_node(self, host_id: str, absence: Absence, now: float) -> None:
        """The first read of a lost host's Node, as soon as its absence is seen rather than when a
        fence is due: the taint fencer takes as proof only a taint that a read after the lapse did
        not find (fence_rules.TaintSightings), so a taint put on soon after the loss counts. A read
        that fails is tried again `fence_retry_seconds` later; it records nothing in etcd."""
        spec = fence_rules.fencer_for(self.settings.fencers, host_id)
        readers = self.settings.node_readers
        assert spec is not None and readers is not None  # _look_due said so
        try:
            node = await fencers.read_node(spec, host_id, self.settings.timeout, readers)
        except Exception as exc:  # the API server's trouble delays the first look, nothing else
            absence.look_at = now + self.settings.retry_first
            log.warning("host %s: its Node could not be read (%s); read again in %.0f s", host_id, exc,
                        self.settings.retry_first, extra={"fields": {"host": host_id}})
            return
        absence.sightings.saw(node)

    def absent_since_unix_ms(self, host_id: str) -> int:
        seen = self.absent.get(host_id)
        return seen.since_unix_ms if seen is not None else 0

    # --- one attempt ------------------------------------------------------------------------------
    async def _read_gates(self, host_id: str) -> tuple[Gates, list[Seen]]:
        reads = await self.store.read_all([
            keys.host(self.store, host_id), keys.host_last(self.store, host_id),
            keys.draining(self.store, host_id), keys.restore_pending(self.store),
            keys.fence_pending(self.store, host_id), keys.fenced(self.store, host_id)])
        reg, last, drain, restore, pending, fenced = reads
        return Gates(registered=reg.entry is not None, draining=drain.entry is not None,
                     restore_pending=restore.entry is not None, pending=pending.entry is not None,
                     last=_decode(last, pb.HostRegistration), fenced=_decode(fenced, pb.FenceAttempt)), reads

    async def _history(self, host_id: str) -> tuple[int, pb.FenceAttempt | None, str]:
        """The last attempt's sequence number, the attempt and its key (0, None, '' with none)."""
        entries, _ = await self.store.list_prefix(keys.fence_history_prefix(self.store, host_id))
        if not entries:
            return 0, None, ""
        last = entries[-1]
        return int(last.key.rsplit("/", 1)[1]), protojson.parse(last.value, pb.FenceAttempt), last.key

    def _backing_off(self, host_id: str, last: pb.FenceAttempt | None, last_key: str, kind: str) -> bool:
        """An unproven attempt this replica has not yet backed off for (its own, or another replica's)
        starts the backoff, timed on this replica's monotonic clock from when it first saw it."""
        if last is None or last.answer == Answer.OFF or self.failure_seen.get(host_id) == last_key:
            return False
        self.failure_seen[host_id] = last_key
        wait = fence_rules.backoff(fence_rules.failures_after(last), self.settings.retry_first, kind)
        self.retry_at[host_id] = time.monotonic() + wait
        return True

    def _skip(self, host_id: str, why: str) -> None:
        if self.unfenceable.get(host_id) != why:
            self.unfenceable[host_id] = why
            log.warning("host %s is not fenced: %s", host_id, why, extra={"fields": {"host": host_id}})

    async def fence(self, host_id: str, requested_by: str,
                    manual: bool = False) -> pb.FenceHostResponse | None:
        """One attempt on `host_id` if every gate is open (None when the loop should just move on; a
        manual attempt is refused with the reason instead), then the recovery its proof allows."""
        gates, reads = await self._read_gates(host_id)
        if fence_rules.already_fenced(gates) and not manual:
            return None  # proven already: what the proof frees, each pass frees (_recover_proven)
        why = fence_rules.refusal(gates, manual)
        spec = fence_rules.fencer_for(self.settings.fencers, host_id)
        if not why and spec is not None and gates.last is not None:
            why = fence_rules.unprovable(spec, gates.last)
        if why or spec is None:
            why = why or "no fencer is configured for it (setting fencers)"
            if manual:
                raise _manual_refusal(gates, host_id, why)
            self._skip(host_id, why)
            return None
        seq, last, last_key = await self._history(host_id)
        if not manual and self._backing_off(host_id, last, last_key, spec.kind):
            return None
        assert gates.last is not None  # refusal() said so
        absence = self.absent.get(host_id)
        absent_for = fence_rules.lost_for(absence.since if absence else None, time.monotonic())
        attempt = pb.FenceAttempt(
            host_id=host_id, incarnation=gates.last.incarnation, program=spec.program,
            coordinator=self.coordinator, requested_by=requested_by, started_at_unix_ms=now_ms(),
            failures=last.failures + 1 if last is not None and last.answer != Answer.OFF else 0,
            absent_for_ms=int(absent_for * 1000))
        pending = await self._begin(host_id, attempt, reads, seq + 1)
        if pending is None:
            if manual:
                raise CoordinatorError(Reason.HOST_FENCING, f"host {host_id} changed (registered, drained, "
                                       "or another replica began fencing it) while this fence began; "
                                       "nothing was run")
            return None
        self.unfenceable.pop(host_id, None)
        log.warning("fencing host %s with %s: %s", host_id, spec.program, requested_by,
                    extra={"fields": {"host": host_id, "program": spec.program}})
        # The reads this replica made since the lapse must be of the registered-last's absence it
        # fences, not an earlier one's.
        last_entry = reads[1].entry
        lost = fencers.Lost(gates.last.node_uid, absence.sightings if absence is not None and last_entry
                            is not None and absence.last_revision == last_entry.mod_revision
                            else fence_rules.TaintSightings())
        actions, answer, detail = await fencers.fence(spec, host_id, self.settings.timeout, lost,
                                                      self.settings.node_readers)
        attempt.actions.extend(actions)
        attempt.answer, attempt.detail, attempt.ended_at_unix_ms = answer.value, detail, now_ms()
        if not await self._end(host_id, attempt, pending, seq + 1):
            # An answer that was not recorded proves nothing. Said so, or `admin fence` showed the
            # device's 'off' and exited 0 while nothing was fenced, recorded or freed.
            answer, detail = Answer.UNKNOWN, (f"{detail}, but the attempt was not recorded (its pending key "
                                              "changed or lapsed first): nothing was fenced or freed")
            attempt.answer, attempt.detail = answer.value, detail
        metrics.FENCE_ATTEMPTS.labels(host_id, answer.value).inc()
        response = pb.FenceHostResponse(attempt=attempt)
        if answer is Answer.OFF:
            log.warning("host %s fenced: %s", host_id, detail, extra={"fields": {"host": host_id}})
            response.results.extend((await self.recover(host_id)).results)
            return response
        alert = {"host": host_id, "alert": "fence-failed", "answer": answer.value}
        log.error("fence of host %s did not prove it off (%s): %s; nothing was freed", host_id, answer.value,
                  detail, extra={"fields": alert})
        return response

    async def _begin(self, host_id: str, attempt: pb.FenceAttempt, reads: list[Seen],
                     seq: int) -> Seen | None:
        """`fence-pending/<host>`, created only if every gate read is unchanged (the registration
        still absent) and no attempt was recorded since; under a lease that outlives the attempt."""
        key = keys.fence_pending(self.store, host_id)
        value = records.encode(attempt)
        lease = await self.store.grant_lease(int(2 * self.settings.timeout + PENDING_SLACK_S))
        compares = [*unchanged(reads), absent(keys.fence_history(self.store, host_id, seq))]
        ok, revision = await self.store.txn(compares, [Put(key, value, lease)])
        if not ok:
            await self.store.revoke_lease(lease)
            return None
        return Seen(key, Entry(key, value, revision, revision, lease))

    async def _end(self, host_id: str, attempt: pb.FenceAttempt, pending: Seen, seq: int) -> bool:
        """The attempt into the host's history and, on proof, `fenced/<host>`; the pending key removed.
        Compares the pending key's revision: an attempt whose key lapsed meanwhile records nothing."""
        value = records.encode(attempt)
        puts = [Put(keys.fence_history(self.store, host_id, seq), value)]
        if attempt.answer == Answer.OFF:
            puts.append(Put(keys.fenced(self.store, host_id), value))
        dropped = [keys.fence_history(self.store, host_id, seq - HISTORY_KEPT)] if seq > HISTORY_KEPT else []
        ok, _ = await self.store.txn(unchanged([pending]), puts, [pending.key, *dropped])
        if ok:
            assert pending.entry is not None
            # It holds nothing any more and lapses by itself: an etcd that fails the revoke must not
            # turn a recorded proof into UNAVAILABLE ("nothing was written") with nothing freed.
            with contextlib.suppress(StoreUnavailable):
                await self.store.revoke_lease(pending.entry.lease)
        else:
            log.error("fence of host %s: its pending key changed or lapsed before the result (%s) was "
                      "recorded; nothing was freed", host_id, attempt.answer,
                      extra={"fields": {"host": host_id}})
        return ok

    # --- after the proof ----------------------------------------------------------------------------
    async def recover(self, host_id: str) -> pb.RecoverHostResponse:
        """Frees what the proof in `fenced/<host>` covers, each session in its own transaction
        comparing its record and the proof's revision."""
        proof = await self.store.read(keys.fenced(self.store, host_id))
        if proof.entry is None:
            return pb.RecoverHostResponse()
        fenced = protojson.parse(proof.entry.value, pb.FenceAttempt)
        revision = proof.entry.mod_revision
        response = await self.lifecycle.free_claims(
            lambda entry, record: fence_rules.recoverable(record, host_id, fenced, entry.mod_revision,
                                                          revision),
            "host-fenced", fence_rules.evidence_detail(fenced), "host-fenced",
            f"host {host_id} fenced by {fenced.program}", [proof])
        for result in response.results:
            log.warning("session %s freed: host %s fenced", result.session_id, host_id,
                        extra={"fields": {"host": host_id, "session": result.session_id,
                                          "applied": result.recovered}})
        return response

    # --- operators ----------------------------------------------------------------------------------
    async def fence_by_hand(self, request: pb.FenceHostRequest) -> pb.FenceHostResponse:
        host_id = identifiers.check_host_id(request.host_id)
        who = operator_text(request.operator, request.reason)
        # The attempt runs to its end if its caller goes (a deadline, Ctrl-C): cancelled with the call,
        # its agent was killed mid-off, nothing was recorded, and the host could register no more
        # until the pending key's lease lapsed.
        attempt = asyncio.ensure_future(self.fence(host_id, who, manual=True))
        self.by_hand.add(attempt)
        attempt.add_done_callback(self.by_hand.discard)
        response = await asyncio.shield(attempt)
        assert response is not None  # a manual attempt runs or is refused
        return response

    async def states(self, registered: set[str]) -> list[pb.HostFenceState]:
        """Each host this replica sees absent, and each with a fence pending or a proof: when this
        replica first saw it absent, and where its fencing stands (its last attempt says it)."""
        pending, _ = await self.store.list_prefix(keys.fence_pending_prefix(self.store))
        fenced, _ = await self.store.list_prefix(keys.fenced_prefix(self.store))
        running = {_host_of(entry.key): entry for entry in pending}
        hosts = self.lost | set(running) | {_host_of(entry.key) for entry in fenced}
        rows = []
        for host_id in sorted(hosts):
            spec = fence_rules.fencer_for(self.settings.fencers, host_id)
            row = pb.HostFenceState(host_id=host_id, absent_since_unix_ms=self.absent_since_unix_ms(host_id),
                                    fencer=spec.program if spec else "")
            if host_id in running:
                row.state = "pending"
                row.attempt.CopyFrom(protojson.parse(running[host_id].value, pb.FenceAttempt))
            elif host_id in registered:
                continue  # back, as a new incarnation: an old proof is history
            else:
                _, last, _ = await self._history(host_id)
                if last is not None:
                    row.state = ("failed" if last.answer != Answer.OFF
                                 else await self._fenced_state(host_id, last))
                    row.attempt.CopyFrom(last)
            rows.append(row)
        return rows

    async def _fenced_state(self, host_id: str, proof: pb.FenceAttempt) -> str:
        """'fenced' while the proof is of the host's registered-last incarnation; '' once a new one
        registered since (it is not fenced, whatever the last attempt says)."""
        last = _decode(await self.store.read(keys.host_last(self.store, host_id)), pb.HostRegistration)
        current = last is None or fence_rules.same_incarnation(last.incarnation, proof.incarnation)
        return "fenced" if current else ""


def _host_of(key: str) -> str:
    return key.rsplit("/", 1)[1]


def _decode(seen: Seen, kind: type[M]) -> M | None:
    return protojson.parse(seen.entry.value, kind) if seen.entry is not None else None


def _manual_refusal(gates: Gates, host_id: str, why: str) -> Exception:
    if gates.registered:
        return CoordinatorError(Reason.HOST_LIVE, f"host {host_id} has a live agent registration: a "
                                "registered agent is never fenced; drain it, or stop it and let its lease "
                                "lapse")
    if gates.pending:
        return CoordinatorError(Reason.HOST_FENCING, f"host {host_id}: {why}")
    return identifiers.InvalidInput(f"host {host_id} cannot be fenced: {why}")
