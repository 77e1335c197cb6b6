"""Lifecycle operations over etcd: archive a session, drain a host, recover a host that is gone for
good, and the restore epoch after an etcd snapshot restore (docs/design.md §3).

Guarantee: every session write is one transaction comparing the record's mod revision and every
other key its decision read (docs/transactions.md; a lost race changes nothing and is reported);
archiving happens only on a verdict that would grant; a refusal
writes nothing; the restore epoch makes every fence non-live (and floors ids the restored etcd
never saw) before any agent is asked anything, stops every token root that is not a claimed
owner's, releases an owner only on its own host's proof, and reopens grants only when every host
that may run owners was searched completely or, unregistered, shown off since the restore gate was
last put (a fence's proof, or an all-tenants operator's recorded word) with no registration since —
in a transaction comparing all that was read of it. restore-epoch never rewrites a gate it finds:
only the operator's put after the restore dates the restore.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from holdfast.common import identifiers
from holdfast.common.names import claim_name, outcome_name
from holdfast.common.reasons import Reason
from holdfast.coordinator import adjudication, keys, lifecycle_rules, protojson, records, revival
from holdfast.coordinator.carry import BUDGET_RETRIES, CarryStore
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import Entry, Put, Seen, absent, unchanged
from holdfast.coordinator.store_errors import StoreUnavailable
from holdfast.proc.ending import KILL_WAIT_S
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

MAX_PURGE = 1000
log = logging.getLogger("holdfast.coordinator.lifecycle")


def operator_text(operator: str, reason: str) -> str:
    if not reason.strip() or not operator.strip():
        raise identifiers.InvalidInput("this operation needs a reason and an operator (both recorded)")
    identifiers.check_text("reason", reason, 1024)
    identifiers.check_text("operator", operator, 256)
    return f"{operator}: {reason}"[:1024]


class Lifecycle:
    def __init__(self, sessions: Sessions, carried: CarryStore) -> None:
        self.sessions = sessions
        self.carried = carried
        self.store = sessions.store

    # --- archive ---------------------------------------------------------------------------
    async def archive(self, request: pb.ArchiveSessionRequest) -> pb.ArchiveSessionResponse:
        who = operator_text(request.operator, request.reason)
        entry, record = await self.sessions.require(request.session_id)
        sid = record.session_id
        if request.expected_fence != record.lease.fence:
            raise CoordinatorError(Reason.STALE_FENCE, f"expected fence {request.expected_fence}, "
                                   f"current {record.lease.fence}")
        verdict, _, reads = await self.sessions.judge_probed(record)
        if not lifecycle_rules.archive_allowed(verdict):
            why = verdict.detail or verdict.reason.value
            raise CoordinatorError(verdict.reason, f"not archived: {why}")
        history, _ = await self.store.list_prefix(keys.history_prefix(self.store, sid))
        archived = pb.SessionRecord()
        archived.CopyFrom(record)
        archived.lease.death_evidence.CopyFrom(pb.DeathEvidence(
            kind="archived", detail=who, observed_at_unix_ms=now_ms(), owner_fence=record.lease.fence))
        puts = [Put(keys.archive_record(self.store, sid), records.encode(archived))]
        puts += [Put(keys.archive_history(self.store, sid, e.key.rsplit("/", 1)[1]), e.value)
                 for e in history]
        # Fenced data and carried state go with the session (retention ends with it, and the carry
        # budget gets its bytes back); history stays readable under archive/, and the archived fence
        # is the floor of any later session of the same id.
        for _ in range(BUDGET_RETRIES):
            carry_reads, carry_puts = await self.carried.discard(sid)
            ok, _ = await self.store.txn(
                unchanged([Seen(self.sessions.key(sid), entry), *reads, *carry_reads]), [*puts, *carry_puts],
                [self.sessions.key(sid), keys.fence(self.store, sid)],
                [keys.history_prefix(self.store, sid), keys.data_prefix(self.store, sid),
                 keys.ops_prefix(self.store, sid), self.carried.prefix(sid)])
            if ok:
                break
            # Another session's upload may have moved a shared carry budget (the cluster's, or the
            # tenant's): that alone is retried.
            decided_on = [Seen(self.sessions.key(sid), entry), *reads]
            now = await asyncio.gather(*(self.store.get(seen.key) for seen in decided_on))
            if any(seen.entry != current for seen, current in zip(decided_on, now, strict=True)):
                raise CoordinatorError(Reason.STALE_FENCE, "the record changed while archiving; nothing was "
                                       "archived")
        else:
            raise CoordinatorError(Reason.UNAVAILABLE,
                                   "the carry budgets kept changing while archiving; retry")
        return pb.ArchiveSessionResponse(record=archived, history_archived=len(history),
                                         verdict=verdict.reason.value)

    async def archived(
        self, request: pb.GetArchivedSessionRequest
    ) -> pb.GetArchivedSessionResponse:
        sid = identifiers.check_session_id(request.session_id)
        entry = await self.store.get(keys.archive_record(self.store, sid))
        if entry is None:
            raise CoordinatorError(Reason.NOT_FOUND, f"no archived session {sid}")
        history, _ = await self.store.list_prefix(keys.archive_history_prefix(self.store, sid))
        return pb.GetArchivedSessionResponse(
            record=records.decode_record(entry.value),
            history=[protojson.parse(e.value, pb.HistoryEntry) for e in history])

    async def purge_archives(
        self, request: pb.PurgeArchivesRequest, in_scope: Callable[[pb.SessionRecord], bool]
    ) -> pb.PurgeArchivesResponse:
        """Retention of archives: history older than the age is dropped, a bounded number per call,
        of the archives `in_scope` admits (the caller's tenants). The archived record shrinks to its
        fence floor, which is kept forever (a few bytes): a revived id must never reuse a fence
        number."""
        limit = min(request.limit or 100, MAX_PURGE)
        cutoff = now_ms() - request.older_than_seconds * 1000
        response = pb.PurgeArchivesResponse()
        after = ""
        while True:
            page, more = await self.store.list_prefix(keys.archives_prefix(self.store), after, 500)
            for entry in page:
                after = entry.key
                if not entry.key.endswith("/record"):
                    continue
                record = records.decode_record(entry.value)
                if not in_scope(record) or not lifecycle_rules.purge_due(record, cutoff):
                    continue
                if len(response.purged) >= limit:
                    response.more = True
                    return response
                sid = record.session_id
                ok, _ = await self.store.txn(
                    unchanged([Seen(entry.key, entry)]),
                    [Put(entry.key, records.encode(lifecycle_rules.floor_only(record)))], (),
                    [keys.archive_history_prefix(self.store, sid)])
                if ok:
                    response.purged.append(sid)
            if not more:
                return response

    # --- drain -----------------------------------------------------------------------------
    async def draining_hosts(self) -> list[str]:
        """Every host with a drain flag, in key order (ListHosts shows them)."""
        prefix = keys.draining_prefix(self.store)
        entries, _ = await self.store.list_prefix(prefix)
        return [e.key.removeprefix(prefix) for e in entries]

    async def all_sessions(self) -> list[tuple[Entry, pb.SessionRecord]]:
        entries, _ = await self.store.list_prefix(keys.sessions_prefix(self.store))
        return [(e, self.sessions.decode(e)) for e in entries]

    async def _host_known(self, host_id: str, sessions: list[tuple[Entry, pb.SessionRecord]]) -> bool:
        """Registered now, or named by a session (its agent may be down for the very maintenance the
        drain is for): `drain nosuchhost` used to set a flag for a host that never existed, exit 0."""
        drain_flag = await self.store.get(keys.draining(self.store, host_id))
        if await self.sessions.registry.get(host_id) is not None or drain_flag is not None:
            return True
        return any(lifecycle_rules.claimed_on(record, host_id) for _, record in sessions)

    async def drain(self, request: pb.DrainHostRequest) -> pb.DrainHostResponse:
        host_id = identifiers.check_host_id(request.host_id)
        identifiers.check_text("operator", request.operator, 256)
        if not request.draining:
            await self.store.txn([], [], [keys.draining(self.store, host_id)])
            return pb.DrainHostResponse(draining=False)
        # Every read before the flag's write: a refusal (no such host, a listing failing) writes
        # nothing.
        sessions = await self.all_sessions()
        if not await self._host_known(host_id, sessions):
            raise CoordinatorError(Reason.HOST_NOT_REGISTERED,
                                   f"host {host_id} has no agent registration and no session names it: "
                                   "nothing to drain (a typo? `holdfast hosts` lists the hosts); nothing "
                                   "was written")
        flag = Put(keys.draining(self.store, host_id), records.encode(
            pb.HistoryEntry(at_unix_ms=now_ms(), transition="draining", detail=request.operator)))
        _, revision = await self.store.txn([], [flag])
        # Listed again once the flag stands, which refuses every grant there after it: a grant
        # between the first listing and the flag is handed off too. This listing failing, the flag
        # stands and the error says so.
        try:
            sessions = await self.all_sessions()
        except StoreUnavailable as exc:
            raise CoordinatorError(Reason.UNAVAILABLE, f"host {host_id} is now draining (no new grants), but "
                                   f"its sessions could not be listed to ask them to hand off ({exc}); run "
                                   "drain again") from None
        # Each handoff request below is this drain's: an undo meanwhile makes the rest lose.
        drain_read = Seen(flag.key, Entry(flag.key, flag.value, revision, revision, 0))
        response = pb.DrainHostResponse(draining=True)
        for entry, record in sessions:
            if not lifecycle_rules.claimed_on(record, host_id):
                continue
            sid, lease = record.session_id, record.lease
            response.still_owned.append(sid)
            if lease.claim_status not in lifecycle_rules.OWNED:
                claim = claim_name(lease.claim_status)
                response.skipped.append(f"{sid}: {claim}, nothing to hand off")
            elif lease.handoff_stage == pb.MANUAL_RECOVERY:
                response.skipped.append(f"{sid}: manual recovery; use `holdfast recover`")
            elif lease.handoff_stage in adjudication.HANDOFF_STAGES:
                response.handoff_requested.append(sid)
            else:
                lease.handoff_stage = pb.HANDOFF_REQUESTED
                lease.handoff_operation_hash = ""  # no successor named: any later Acquire is adjudicated
                lease.handoff_requested_by_host = f"drain of {host_id}"
                detail = f"drain {request.operator}"
                if await self.sessions.transition(entry, record, "handoff-requested", detail,
                                                  reads=[drain_read]):
                    response.handoff_requested.append(sid)
                else:
                    response.skipped.append(f"{sid}: changed while draining; run drain again")
        return response

    # --- bulk recovery ---------------------------------------------------------------------
    async def recover_host(self, request: pb.RecoverHostRequest, peer: str,
                           in_scope: Callable[[pb.SessionRecord], bool],
                           all_tenants: bool = False) -> pb.RecoverHostResponse:
        """Every session the host holds and `in_scope` admits (the operator's tenants), released on
        the operator's word; those of other tenants are left as they are, and nothing of them is
        answered (not even how many): a scoped operator learns nothing of another tenant. An
        all-tenants operator's scope admits every session, so there are none it skipped to count.
        While a restore is pending, an all-tenants operator's word also counts the host as searched
        for it (restore_epoch): a node gone for good has nothing else to show it is off."""
        host_id = identifiers.check_host_id(request.host_id)
        who = operator_text(request.operator, request.reason)
        registration = await self.sessions.registry.seen(host_id)
        if registration.entry is not None:
            # Operator evidence is for a node that is gone; a registered agent can answer for itself.
            # Checked here and compared absent in each session's transaction: an agent that
            # registers meanwhile stops the rest.
            raise CoordinatorError(Reason.HOST_LIVE, f"host {host_id} has a live agent registration: drain "
                                   "it (`holdfast drain`), or stop its agent and let its lease expire first")
        if all_tenants:
            await self._declare_off(host_id, who, registration)
        # The compare on each record's mod revision is the expected-fence check: the fence read is the
        # one freed.
        return await self.free_claims(
            lambda _, record: lifecycle_rules.claimed_on(record, host_id) and in_scope(record),
            "operator-asserted", f"host {host_id} gone: {who}", "recover", f"host {host_id} by {peer}",
            [registration])

    async def _declare_off(self, host_id: str, who: str, registration: Seen) -> None:
        """`restore-host-off/<host>`, the operator's word as evidence, while a restore is pending;
        written only if the gate, the registration (absent) and registered-last are as read. Before
        any session is freed: a declaration that loses writes nothing at all."""
        gate, last = await self.store.read_all([keys.restore_pending(self.store),
                                                keys.host_last(self.store, host_id)])
        if gate.entry is None:
            return  # no restore under way: the word is for the sessions alone
        declared = Put(keys.restore_host_off(self.store, host_id), records.encode(pb.HistoryEntry(
            at_unix_ms=now_ms(), transition="host-off", detail=f"host {host_id} off: {who}"[:1024])))
        ok, _ = await self.store.txn(unchanged([gate, registration, last]), [declared])
        if not ok:
            raise CoordinatorError(Reason.UNAVAILABLE, f"host {host_id}: its registration, registered-last "
                                   "or the restore gate changed while recover-host ran; nothing was written, "
                                   "run it again")

    async def free_claims(self, select: Callable[[Entry, pb.SessionRecord], bool], kind: str, evidence: str,
                          transition: str, detail: str, reads: list[Seen]) -> pb.RecoverHostResponse:
        """Every session `select` picks released on `evidence` (its fence invalidated at once), each in
        its own transaction comparing its record and `reads` — what the whole decision rests on (a
        host's registration read absent, a fence's proof): a change of them stops the rest."""
        response = pb.RecoverHostResponse()
        for entry, record in await self.all_sessions():
            if not select(entry, record):
                continue
            result = response.results.add(session_id=record.session_id, fence=record.lease.fence)
            lifecycle_rules.release_on_evidence(record.lease, kind, evidence, now_ms())
            result.recovered = await self.sessions.transition(entry, record, transition, detail, reads=reads)
            if not result.recovered:
                result.error = "the record changed meanwhile; `holdfast show` it and recover it alone"
        return response

    # --- restore epoch ---------------------------------------------------------------------
    async def restore_epoch(
        self, request: pb.RestoreEpochRequest
    ) -> pb.RestoreEpochResponse:
        who = operator_text(request.operator, request.reason)
        epoch = request.epoch or lifecycle_rules.DEFAULT_EPOCH
        if not 1 <= epoch <= 1 << 40:
            raise identifiers.InvalidInput(f"epoch must be in 1..{1 << 40}")
        expected = [identifiers.check_host_id(h) for h in request.expected_hosts]
        response = pb.RestoreEpochResponse()
        to_judge: list[str] = []
        # 0. Sessions created after the snapshot have no record here, and their ids would start again
        # at fence 1: a fence an orphan (or an external store) has already seen. New ids start above.
        await self._raise_new_session_floor(epoch)
        # 1. Every fence non-live and every floor raised, before any agent is asked anything.
        for entry, record in await self.all_sessions():
            lease = record.lease
            row = response.sessions.add(session_id=record.session_id, old_fence=lease.fence)
            for _ in range(3):
                was = lease.claim_status
                lease.minimum_next_fence = lifecycle_rules.restore_floor(lease, epoch)
                lease.claim_status = lifecycle_rules.restore_claim(lease)
                if lease.claim_status != was:
                    lease.death_evidence.CopyFrom(pb.DeathEvidence(
                        kind="restore-epoch", detail=who, observed_at_unix_ms=now_ms(),
                        owner_fence=lease.fence))
                if await self.sessions.transition(entry, record, "restore-epoch", f"+{epoch} {who}"):
                    row.minimum_next_fence = lease.minimum_next_fence
                    row.outcome = claim_name(lease.claim_status)
                    if was in lifecycle_rules.OWNED:
                        to_judge.append(record.session_id)
                    break
                entry, record = await self.sessions.require(record.session_id)
                lease = record.lease
            else:
                row.outcome, row.detail = "unchanged", "kept changing; run restore-epoch again"
        # 2. Orphans: token roots on any registered host that no record names.
        current = [record for _, record in await self.all_sessions()]
        known = lifecycle_rules.known_tokens(current)
        registered = [host.host_id for host in await self.sessions.registry.list()]
        for host_id in registered:
            response.hosts.append(await self._stop_orphans(host_id, known))
        gate = await self.store.read(keys.restore_pending(self.store))
        off: dict[str, list[Seen]] = {}  # unregistered hosts proven off since the restore, on what was read
        for host_id in lifecycle_rules.unsearched_hosts(lifecycle_rules.hosts_named(current), expected,
                                                        registered):
            reads = await self._off_since_restore(host_id, gate)
            if reads:
                off[host_id] = reads
                continue
            response.hosts.append(pb.RestoreEpochHost(host_id=host_id,
                                                      error=lifecycle_rules.unsearched_hint(host_id)))
        # 3. Re-adjudicate every owner made conflicted: released only on its own host's proof.
        by_id = {row.session_id: row for row in response.sessions}
        for sid in to_judge:
            entry, record = await self.sessions.require(sid)
            probe, registration = await self.sessions.probe(record.lease.owner)
            row = by_id[sid]
            if adjudication.release_allowed(record.lease, probe):
                record.lease.claim_status = pb.RELEASED
                record.lease.death_evidence.CopyFrom(pb.DeathEvidence(
                    kind=outcome_name(probe.outcome),
                    detail=f"restore-epoch: {probe.reason}"[:1024],
                    observed_at_unix_ms=probe.observed_at_unix_ms, owner_fence=record.lease.fence))
                if await self.sessions.transition(entry, record, "restore-released", probe.reason,
                                              reads=[registration]):
                    row.outcome, row.detail = "released", "owner proven gone by its host's agent"
                    continue
            row.detail = (f"owner not proven gone ({probe.tree_reason or probe.reason}); stop it, then "
                          f"`holdfast recover {sid} --fence {record.lease.fence} --reason TEXT`")
        # 4. Grants reopen only when nothing a restore hides can still be running.
        pending = keys.restore_pending(self.store)
        response.grants_reopened = lifecycle_rules.grants_may_reopen(response)
        if response.grants_reopened:
            # A host counted as searched on its evidence: the gate, its registration, registered-last,
            # proof and declaration compared as read (it registered, or a restore began, meanwhile:
            # grants stay closed). The declarations are this restore's, and go with its gate.
            decided_on = [gate, *(seen for reads in off.values() for seen in reads)] if off else []
            ok, _ = await self.store.txn(unchanged(decided_on), [], [pending],
                                         [keys.restore_host_off_prefix(self.store)])
            if not ok:
                response.grants_reopened = False
                response.hosts.extend(pb.RestoreEpochHost(
                    host_id=host_id, error="its registration, proof or declaration changed while "
                    "restore-epoch ran; run restore-epoch again") for host_id in sorted(off))
        if not response.grants_reopened:
            # Grants stay closed: the gate is put if absent, never rewritten. Its last put dates the
            # restore (lifecycle_rules.off_since_restore); a rewrite here would date it later and
            # discard a fence's proof or an operator's word given between the two runs.
            unfinished = Put(pending, f"restore-epoch unfinished: {who}".encode())
            await self.store.txn([absent(pending)], [unfinished])
        return response

    async def _off_since_restore(self, host_id: str, gate: Seen) -> list[Seen]:
        """What shows unregistered `host_id` off since the restore gate was last put (lifecycle_rules.
        off_since_restore), as read, or [] when nothing does."""
        reads = await self.store.read_all([
            self.sessions.registry.key_of(host_id), keys.host_last(self.store, host_id),
            keys.fenced(self.store, host_id), keys.restore_host_off(self.store, host_id)])
        registration, last, *evidence = reads
        if registration.entry is not None or gate.entry is None:
            return []
        last_registered = last.entry.mod_revision if last.entry is not None else 0
        for seen in evidence:
            if seen.entry is not None and lifecycle_rules.off_since_restore(
                    gate.entry.mod_revision, last_registered, seen.entry.mod_revision):
                log.warning("restore-epoch: host %s counts as searched: %s", host_id,
                            "fenced since the restore" if seen is reads[2] else "declared off by an operator "
                            "since the restore", extra={"fields": {"host": host_id}})
                return reads
        return []

    async def _raise_new_session_floor(self, epoch: int) -> None:
        """Read-modify-write of the floor, compared: two restore-epochs at once both raise it."""
        for _ in range(8):
            read = await self.store.read(keys.new_session_floor(self.store))
            floor = lifecycle_rules.new_session_floor(revival.floor_of(read), epoch)
            ok, _ = await self.store.txn(unchanged([read]), [Put(read.key, str(floor).encode())])
            if ok:
                return
        raise CoordinatorError(Reason.STALE_FENCE,
                               "the new-session floor kept changing; run restore-epoch again")

    async def _stop_orphans(self, host_id: str, known: set[str]) -> pb.RestoreEpochHost:
        row = pb.RestoreEpochHost(host_id=host_id)
        reg = await self.sessions.registry.get(host_id)
        stub = self.sessions.router.agent(reg)
        if stub is None:
            row.error = "registration vanished; run restore-epoch again once it is back"
            return row
        try:
            listing = await stub.ListTokenRoots(apb.ListTokenRootsRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:  # reported per host: the others are still handled
            row.error = f"ListTokenRoots failed: {exc}; run restore-epoch again"
            return row
        row.complete, row.roots = listing.complete, len(listing.roots)
        for identity in lifecycle_rules.orphans(listing.roots, known):
            result = await self.sessions.router.kill(identity, reg, KILL_WAIT_S)
            stopped = lifecycle_rules.orphan_stopped(result)
            (row.orphans_stopped if stopped else row.orphans_not_stopped).append(
                f"pid {identity.pid}" + ("" if stopped else f": {result.tree_reason or result.reason}"))
        return row

