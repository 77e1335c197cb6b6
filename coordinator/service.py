"""The Coordinator gRPC servicer: stateless over etcd, so any number of replicas behave as one.

Guarantee: only Acquire mints a fence, token and secret; every transition is one etcd transaction
comparing the record's mod revision and every other key its decision read (docs/transactions.md),
and rewriting `fence/<id>`; every fenced write is one transaction comparing `fence/<id>`; a refusal
writes nothing and signals nothing (a forced Acquire kills only after a `force-pending` transition
that compares every precondition of the grant); indeterminate never grants.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from holdfast.common import identifiers, reasons, tls
from holdfast.common.reasons import Reason
from holdfast.coordinator import (
    adjudication,
    attestation,
    carry,
    fencing,
    grant_gates,
    keys,
    lifecycle,
    lifecycle_rules,
    metrics,
    protojson,
    records,
    tenancy,
)
from holdfast.coordinator.adjudication import AcquireAsk, Action
from holdfast.coordinator.cluster import ClusterIdentity
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.grant_gates import GrantGates
from holdfast.coordinator.host_fencing import FencingSettings, HostFencing
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.replays import ReplayLease
from holdfast.coordinator.routing import Router
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import (
    Compacted,
    Entry,
    Put,
    Seen,
    Store,
    StoreUnavailable,
    value_equals,
)
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

COMMIT_WINDOW_MS = 30_000
MAX_CHAIN = 256
MAX_PAGE = 500
RACE_RETRIES = 16


def caller_of(context: grpc.aio.ServicerContext, host_id: str) -> str:
    # No mTLS identity yet: the peer address (without its ephemeral port) plus the claimed host id.
    peer = context.peer()
    return f"{peer.rsplit(':', 1)[0]}|{host_id}"


def op_hash(rpc: str, caller: str, operation_id: str) -> str:
    return hashlib.sha256(f"{rpc}\0{caller}\0{operation_id}".encode()).hexdigest()


def handoff_hash(operation_id: str) -> str:
    """What a record keeps of the operation that asked for its handoff (never the id itself)."""
    return hashlib.sha256(f"handoff\0{operation_id}".encode()).hexdigest()


def is_operator(context: grpc.aio.ServicerContext) -> bool:
    """The verified peer certificate says operator (never a claim in the request)."""
    role = tls.peer_role(context)
    return role is not None and role.kind == "operator"


REFUSED = (identifiers.InvalidInput, StoreUnavailable, CoordinatorError)


async def _refuse(rpc: str, exc: identifiers.InvalidInput | StoreUnavailable | CoordinatorError,
                  context: grpc.aio.ServicerContext) -> None:
    """A domain error as its status, counted by reason."""
    if isinstance(exc, identifiers.InvalidInput):
        error = CoordinatorError(Reason.INVALID_ARGUMENT, str(exc))
    elif isinstance(exc, StoreUnavailable):
        metrics.ETCD_ERRORS.labels(rpc).inc()
        error = CoordinatorError(Reason.UNAVAILABLE, f"{exc}; " + (
            "a transaction went unanswered and may have been applied: check the session "
            "(`holdfast show`) before repeating a call that is not safe to repeat"
            if exc.outcome_unknown else "nothing was written"))
    else:
        error = exc
    metrics.REFUSALS.labels(rpc, error.reason).inc()
    await context.abort_with_status(error.to_status())


def _handler(fn: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """Turns domain errors into statuses; anything unexpected stays an INTERNAL error, not a crash."""

    async def wrapped(self: CoordinatorService, request: object, context: grpc.aio.ServicerContext) -> object:
        try:
            return await fn(self, request, context)
        except REFUSED as exc:
            refused = exc
        await _refuse(fn.__name__, refused, context)

    wrapped.__name__ = fn.__name__
    return wrapped


def _stream_handler(fn: Callable[..., AsyncIterator[object]]) -> Callable[..., AsyncIterator[object]]:
    """`_handler` for a server-streaming call: a domain error ends the stream with its status."""

    async def wrapped(self: CoordinatorService, request: object,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        try:
            async for item in fn(self, request, context):
                yield item
            return
        except REFUSED as exc:
            refused = exc
        await _refuse(fn.__name__, refused, context)

    wrapped.__name__ = fn.__name__
    return wrapped


def _tenant_checked(fn: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """The caller admitted to the request's session (its tenant's, coordinator/tenancy.py) before
    the handler reads anything for it, asks an agent or writes: WRONG_TENANT otherwise."""

    async def wrapped(self: CoordinatorService, request: Any, context: grpc.aio.ServicerContext) -> object:
        await self.tenancy.admit(fn.__name__, request.session_id, context)
        return await fn(self, request, context)

    wrapped.__name__ = fn.__name__
    return wrapped


@dataclass(frozen=True)
class Exited:
    """An owner whose exit event ended a wait, with what its agent answered (the event's result, or
    a probe's; None: no event came) and the registration of that agent, compared by a decision
    that uses the answer. `held`: the reads the wait began on (the grant's gates, then the replay,
    the record as read or as this call wrote it, the revival keys), which a grant on the event's
    proof may rest on instead of a re-read."""

    owner: apb.ProcessIdentity
    result: apb.ProbeResult | None
    registration: Seen
    held: tuple[GrantGates, list[Seen]] | None = None


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, store: Store, agent_tls_dir: Path | None = None,
                 commit_window_ms: int = COMMIT_WINDOW_MS, carry_session_cap: int = carry.DEFAULT_SESSION_CAP,
                 carry_budget: int = carry.DEFAULT_BUDGET, fencing: FencingSettings | None = None,
                 name: str = "", default_tenant: str = tenancy.DEFAULT_TENANT) -> None:
        self.store = store
        self.tenancy = tenancy.Tenancy(store, default_tenant)
        self.commit_window_ms = commit_window_ms
        self.registry = Registry(store)
        self.router = Router(agent_tls_dir)
        self.sessions = Sessions(store, self.registry, self.router)
        self.carried = carry.CarryStore(self.sessions, carry_session_cap, carry_budget)
        self.lifecycle = lifecycle.Lifecycle(self.sessions, self.carried)
        self.host_fencing = HostFencing(self.lifecycle, fencing or FencingSettings(), name)
        self.replays = ReplayLease(store)
        self.cluster = ClusterIdentity(store)

    async def _check_cluster(self, cluster_id: str) -> str:
        """A grant minted by another holdfast cluster is refused before anything is read or written;
        empty is an older client's request, accepted. Returns this cluster's identity."""
        ours = await self.cluster.current()
        if cluster_id and cluster_id != ours:
            raise CoordinatorError(Reason.WRONG_CLUSTER, f"this grant was minted by holdfast cluster "
                                   f"{cluster_id[:64]!r}; this coordinator serves {ours!r}. Nothing was "
                                   "written")
        return ours

    # --- acquisition ---------------------------------------------------------------------
    @_handler
    async def Acquire(
        self, request: pb.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireResponse:
        sid = identifiers.check_session_id(request.session_id)
        identifiers.check_operation_id(request.operation_id)
        identifiers.check_host_id(request.host_id)
        identifiers.check_text("provider", request.provider, 128)
        identifiers.check_text("location", request.location, 1024)
        if request.has_expected_fence and request.expected_fence > identifiers.MAX_FENCE:
            raise identifiers.InvalidInput("expected fence out of range")
        if not 0 <= request.wait_seconds <= 3600:
            raise identifiers.InvalidInput("wait_seconds must be in 0..3600")
        gate_token = attestation.check_gate(request.gate) if request.HasField("gate") else ""
        caller = self.tenancy.caller(context)
        attested: attestation.Attested | None = None
        ohash = op_hash("Acquire", caller_of(context, request.host_id), request.operation_id)
        ops_key = keys.op(self.store, sid, ohash)
        ask = AcquireAsk(
            request.expected_fence if request.has_expected_fence else None, handoff_hash(request.operation_id)
        )
        started = time.monotonic()
        deadline = started + request.wait_seconds
        held: adjudication.Verdict | None = None
        exited: Exited | None = None  # the owner whose exit event ended the last wait
        attempts = 0
        while attempts < RACE_RETRIES:
            attempts += 1
            gates, (replay, record_read, *revival), early = await self._read_for_grant(
                request, ops_key, exited)
            exited = None
            entry = record_read.entry
            record = self.sessions.decode(entry) if entry is not None else None
            # On every reading, before anything is decided, asked or written: the id may have been
            # made by another tenant since the last one (the grant compares it read absent).
            self.tenancy.judge("Acquire", sid, record or lifecycle.archived_record(revival[0]), caller)
            if replay.entry is not None:
                # This operation was granted already (an earlier try, or the same call racing itself).
                stored = protojson.parse(replay.entry.value, pb.AcquireResponse)
                if adjudication.replay_still_valid(stored.grant.fence, record):
                    return stored
                if not adjudication.replay_released(stored.grant.fence, record):
                    raise CoordinatorError(Reason.STALE_FENCE,
                                           "the fence has moved since this operation's grant")
            verdict = adjudication.adjudicate(record, ask, None, now_ms())
            if gate_token and attested is None and verdict.action in (Action.GRANT, Action.PROBE):
                # Before anything is decided, written or signalled: a gate that cannot be attested
                # refuses here with nothing done, never after a force-pending write or a kill.
                attested = await self._attest_gate(request, gate_token, record, gates)
            reads: list[Seen] = [replay]
            if verdict.action is Action.PROBE and record is not None:
                if request.force:
                    # The kill is authorised only by a force-pending transaction comparing every
                    # precondition of the grant; until it lands, nothing is signalled.
                    entry = await self._force_pending(entry, record, request, ask, context)
                    if entry is None:
                        continue  # the record or a precondition changed: re-read, re-decide
                elif request.takeover and adjudication.ask_owner(record.lease, ask.operation_hash,
                                                                 request.host_id):
                    # The owner is asked to let go by the takeover itself, once its gate is attested
                    # and every gate of the grant is open: a takeover refused up to here asked
                    # nothing of anyone, and the owner's ending overlaps no second round trip.
                    # Its exit stream is opened beside the request's transaction, so it is armed
                    # (a pidfd on the owner) before the owner can hear the request: opened after,
                    # it was 1-5 ms of every handoff. The stream reads and signals nothing: a
                    # request that loses or is refused drops it, having asked nothing of anyone.
                    remaining = deadline - time.monotonic()
                    watch = (asyncio.ensure_future(self.sessions.wait_exit(record.lease.owner, remaining))
                             if remaining > 0 else None)
                    try:
                        entry = await self._ask_owner(entry, record, gates, replay)
                        if entry is None:
                            continue
                        if watch is not None:
                            # Just asked, it is ending: a probe now would find it alive. Its exit is
                            # waited for instead, on the record as this transaction wrote it.
                            exited = await self._wait_exit(record.lease.owner, watch, gates,
                                                           [replay, Seen(record_read.key, entry), *revival])
                            continue
                    finally:
                        if watch is not None:
                            watch.cancel()
                if early is not None and early.result is not None and early.owner == record.lease.owner:
                    probe, registration = early.result, early.registration
                else:
                    probe, registration = await self.sessions.probe(record.lease.owner, kill=request.force)
                reads.append(registration)
                verdict = adjudication.adjudicate(record, ask, probe, now_ms())
            if early is not None and early.held is not None and (
                    verdict.action is not Action.GRANT or request.await_release):
                # Decided on the reads held over the wait: only a grant may rest on them (its
                # transaction compares each one). Anything else is decided again on a fresh read.
                exited = replace(early, held=None)
                continue
            metrics.INDETERMINATE.verdict(sid, verdict.reason.value)
            if verdict.action is Action.TO_MANUAL and record is not None:
                record.lease.handoff_stage = pb.MANUAL_RECOVERY
                await self.sessions.transition(entry, record, "manual-recovery", verdict.detail, reads=reads)
                raise CoordinatorError(Reason.MANUAL_RECOVERY, verdict.detail)
            remaining = deadline - time.monotonic()
            if verdict.reason is adjudication.Reason.HELD and remaining > 0 and record is not None:
                held = verdict
                # --wait: hold the call open on the owner host's exit stream, then adjudicate afresh.
                exited = await self._wait_exit(record.lease.owner,
                                               self.sessions.wait_exit(record.lease.owner, remaining),
                                               gates, [replay, Seen(record_read.key, entry), *revival])
                continue
            if verdict.action is not Action.GRANT:
                raise CoordinatorError(verdict.reason, verdict.detail)
            if (request.await_release and verdict.reason is adjudication.Reason.OWNER_DEAD
                    and record is not None and record.lease.claim_status in (pb.COMMITTED, pb.LIVE)):
                # Decided on the record as read: a release landing after this read is the next call's.
                raise CoordinatorError(Reason.RELEASE_PENDING, f"the owner at fence {record.lease.fence} has "
                                       f"ended ({verdict.detail}) but has not released; nothing was granted")
            response = await self._grant(entry, record, request, verdict, ops_key, gates, reads,
                                         revival, caller.tenant, gate_token, attested)
            if response is not None:
                if request.takeover or verdict.reason is adjudication.Reason.OWNER_DEAD:
                    metrics.TAKEOVER_SECONDS.labels(verdict.reason.value).observe(time.monotonic() - started)
                return response
        if held is not None:
            raise CoordinatorError(held.reason, held.detail)
        raise CoordinatorError(Reason.STALE_FENCE, "lost every race for this session; retry")

    async def _attest_gate(self, request: pb.AcquireRequest, token: str, record: pb.SessionRecord | None,
                           gates: GrantGates) -> attestation.Attested | None:
        """The caller's gate attested by its host's agent, in a session cgroup named for the fence
        the grant would have now; None when the gate's token is not under the variable that host's
        agent reads (the grant is then a reservation, committed by CommitOwner as before)."""
        host = gates.judge()
        if host.spawn_token_env != request.gate.spawn_token_env:
            return None
        fence = fencing.next_fence(record.lease.fence, record.lease.minimum_next_fence) if record else 1
        return await attestation.attest(self.router, request.host_id, gates.registration, token,
                                        host.spawn_token_env, request.gate.pid_hint, request.session_id,
                                        fence)

    async def _grant(
        self,
        entry: Entry | None,
        record: pb.SessionRecord | None,
        request: pb.AcquireRequest,
        verdict: adjudication.Verdict,
        ops_key: str,
        gates: GrantGates,
        reads: Sequence[Seen],
        revival: list[Seen],
        tenant: str,
        gate_token: str = "",
        attested: attestation.Attested | None = None,
    ) -> pb.AcquireResponse | None:
        """The grant transaction, comparing the record, what the verdict read (the owner host's
        registration when probed), the grant's gates and, for an id with no record, the archive
        record and floor its first fence came from (`revival`, read with the record). With an
        attested gate whose registration is still the one read, the gate is the owner in the same
        transaction (commit at grant); else the grant is a reservation. None when it lost a race."""
        host = gates.judge()
        cluster_id, cluster_reads, cluster_puts = await self.cluster.for_grant()
        reads = [*reads, *gates.reads, *cluster_reads]
        if record is None:
            record = lifecycle.revived(request.session_id, request.provider, request.location, *revival)
            record.tenant = record.tenant or tenant  # a revived id stays its tenant's
            reads += revival
        old = record.lease
        secret, at = fencing.mint_secret(), now_ms()
        # A gate's token is its own (its run minted the secret it derives from); else a fresh one.
        token = gate_token or fencing.mint_spawn_token()
        lease = pb.Lease(
            fence=fencing.next_fence(old.fence, old.minimum_next_fence),
            minimum_next_fence=old.minimum_next_fence,
            claim_status=pb.RESERVED,
            handoff_stage=pb.NONE,
            reserved_spawn_token=token,
            spawn_token_env=host.spawn_token_env,
            reserved_host_id=request.host_id,
            reserved_at_unix_ms=at,
            commit_deadline_unix_ms=at + self.commit_window_ms,
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
        replay_lease = await self.replays.current()
        stored = Put(ops_key, records.encode(response), replay_lease)
        try:
            ok = await self.sessions.transition(entry, record, "grant", detail, (stored, *cluster_puts),
                                                reads)
        except grpc.aio.AioRpcError as exc:
            if not self.replays.lost(exc, replay_lease):
                raise
            return None  # nothing was written; the caller's next attempt uses a new lease
        if ok:
            metrics.GRANTS.labels(verdict.reason.value).inc()
        return response if ok else None

    async def _ask_owner(self, entry: Entry | None, record: pb.SessionRecord, gates: GrantGates,
                         replay: Seen) -> Entry | None:
        """Writes a takeover's handoff request (`record` marked by `adjudication.ask_owner`),
        comparing the record, the grant's gates and this operation's replay key (read absent: a
        grant of this very operation meanwhile must not be asked to end); returns the record's new
        entry, None when the transaction lost. Refuses (writing nothing) when a gate is closed."""
        gates.judge()
        return await self.sessions.transition_at(entry, record, "handoff-requested", gates.host_id,
                                                 reads=[replay, *gates.reads])

    async def _wait_exit(self, owner: apb.ProcessIdentity,
                         waiting: Awaitable[tuple[apb.ProbeResult | None, Seen]], gates: GrantGates,
                         also: list[Seen]) -> Exited:
        """Until `waiting` (the owner's exit stream, `sessions.wait_exit`, begun by the caller) has
        the owner's first exit event or runs out; proves nothing by itself. Returns the owner and
        the event, with the reads the wait began on."""
        return Exited(owner, *await waiting, held=(gates, also))

    async def _read_for_grant(
        self, request: pb.AcquireRequest, ops_key: str, exited: Exited | None
    ) -> tuple[GrantGates, list[Seen], Exited | None]:
        """Everything a decision reads, in one round trip at one revision: the grant's gates, then
        this operation's replay, the record and what a new record's first fence rests on, each
        compared in the grant's transaction. After a wait ended by an owner's exit event, that
        owner's proof comes with the read: the event's own when its agent proved the tree gone with
        it, else a probe beside the read (never a kill). Either proves the same whichever lands
        first, the grant still follows both, and it is used only if the record still names that
        owner. With the event's own proof, the reads are those the wait began on, no round trip:
        a grant may rest on them, nothing else (Acquire decides anything else on a fresh read)."""
        if exited is None or request.force:
            gates, also = await self._read(request, ops_key)
            return gates, also, None
        if exited.result is not None and adjudication.proves_gone(exited.result):
            if exited.held is not None:
                # No round trip: the grant that may follow compares every one of these keys in its
                # transaction, so a change since they were read makes it lose (and the next pass
                # reads afresh); it can grant nothing a fresh read would refuse.
                return *exited.held, exited
            gates, also = await self._read(request, ops_key)
            return gates, also, exited
        (gates, also), (probe, registration) = await asyncio.gather(
            self._read(request, ops_key), self.sessions.probe(exited.owner))
        return gates, also, Exited(exited.owner, probe, registration)

    async def _read(self, request: pb.AcquireRequest, ops_key: str) -> tuple[GrantGates, list[Seen]]:
        sid = request.session_id
        return await grant_gates.read(self.store, self.registry, request.host_id, ops_key,
                                      self.sessions.key(sid), *self.lifecycle.revival_keys(sid))

    async def _force_pending(
        self,
        entry: Entry | None,
        record: pb.SessionRecord,
        request: pb.AcquireRequest,
        ask: AcquireAsk,
        context: grpc.aio.ServicerContext,
    ) -> Entry | None:
        """Authorises a forced Acquire's kill: refuses (writing nothing) unless this caller's
        handoff request is the record's, or the peer is an operator, and unless every gate of the
        grant is open; then one transaction marks the record force-pending, comparing the record
        (adjudicated already: stale fence, manual recovery, another operation's request) and every
        gate it read. Returns the force-pending record's entry, None when that transaction lost."""
        if not adjudication.force_allowed(record.lease, ask, is_operator(context)):
            raise CoordinatorError(Reason.FORCE_NOT_ALLOWED, "force is honoured only for the caller whose "
                                   "handoff request the record holds (run --takeover --force) or an operator")
        gates, _ = await grant_gates.read(self.store, self.registry, request.host_id)
        gates.judge()
        lease = record.lease
        lease.handoff_stage = pb.FORCE_PENDING
        lease.handoff_operation_hash = ask.operation_hash
        lease.handoff_requested_by_host = request.host_id
        return await self.sessions.transition_at(entry, record, "force-pending", request.host_id,
                                                 reads=gates.reads)

    @_handler
    @_tenant_checked
    async def CommitOwner(
        self, request: pb.CommitOwnerRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOwnerResponse:
        cluster = await self._check_cluster(request.cluster_id)
        entry, record = await self.sessions.require(request.session_id)
        fencing.check_grant(record, request.fence, request.secret)
        lease = record.lease
        if lease.claim_status != pb.RESERVED:
            raise CoordinatorError(Reason.STALE_FENCE, "this grant is no longer a reservation")
        # The attestation is the reserved host's registered agent's: compared, so an agent that
        # re-registered meanwhile (another incarnation, another token variable) makes it retry.
        attested = await attestation.attest(
            self.router, lease.reserved_host_id, await self.registry.seen(lease.reserved_host_id),
            lease.reserved_spawn_token, lease.spawn_token_env, request.pid_hint, record.session_id,
            lease.fence)
        identity = attested.identity
        attestation.commit(lease, identity, now_ms())
        committed = f"pid {identity.pid} on {identity.host_id}"
        if not await self.sessions.transition(entry, record, "commit", committed,
                                              reads=[attested.registration]):
            raise CoordinatorError(Reason.STALE_FENCE, "the record changed during commit")
        return pb.CommitOwnerResponse(record=record, cluster_id=cluster)

    @_handler
    @_tenant_checked
    async def RecordProviderHandle(
        self, request: pb.RecordProviderHandleRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordProviderHandleResponse:
        cluster = await self._check_cluster(request.cluster_id)
        identifiers.check_text("handle", request.handle, records.MAX_HANDLE_CHARS)
        entry, record = await self.sessions.require(request.session_id)
        fencing.check_grant(record, request.fence, request.secret)
        if record.lease.claim_status not in (pb.COMMITTED, pb.LIVE):
            raise CoordinatorError(Reason.NOT_LIVE, "a provider handle needs a committed owner")
        if len(record.provider_handle_chain) >= MAX_CHAIN:
            raise CoordinatorError(Reason.CHAIN_FULL, f"the provider handle chain holds {MAX_CHAIN} links")
        record.provider_handle_chain.add(
            handle=request.handle, minted_at_fence=request.fence, observed_at_unix_ms=now_ms()
        )
        record.lease.claim_status = pb.LIVE
        if not await self.sessions.transition(entry, record, "provider-handle", request.handle[:64]):
            raise CoordinatorError(Reason.STALE_FENCE, "the record changed; this grant may be stale")
        return pb.RecordProviderHandleResponse(record=record, cluster_id=cluster)

    @_handler
    @_tenant_checked
    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        cluster = await self._check_cluster(request.cluster_id)
        entry, record = await self.sessions.require(request.session_id)
        fencing.check_grant(record, request.fence, request.secret)
        lease = record.lease
        reads: list[Seen] = []
        if lease.claim_status in (pb.COMMITTED, pb.LIVE):
            probe, registration = await self.sessions.probe(lease.owner)
            reads.append(registration)
            if not adjudication.release_allowed(lease, probe):
                if probe.answered_by_host_id != lease.owner.host_id:
                    # Nobody looked (an agent re-registering, unreachable): not "alive", unknown.
                    raise CoordinatorError(Reason.OWNERSHIP_UNKNOWN, "the owner host's agent did not answer: "
                                           f"{probe.reason or 'no reason given'}; nothing was released")
                raise CoordinatorError(
                    Reason.TREE_ALIVE, probe.tree_reason or probe.reason or "owner tree not proven gone"
                )
        elif lease.claim_status != pb.RESERVED:
            raise CoordinatorError(Reason.STALE_FENCE, "this grant is no longer held")
        lease.claim_status = pb.RELEASED
        adjudication.answer_drain_request(lease)
        lease.death_evidence.CopyFrom(
            pb.DeathEvidence(kind="released", observed_at_unix_ms=now_ms(), owner_fence=lease.fence)
        )
        if not await self.sessions.transition(entry, record, "release", reads=reads):
            raise CoordinatorError(Reason.STALE_FENCE, "the record changed during release")
        return pb.ReleaseResponse(record=record, cluster_id=cluster)

    # --- fenced data ---------------------------------------------------------------------
    @_handler
    @_tenant_checked
    async def FencedPut(
        self, request: pb.FencedPutRequest, context: grpc.aio.ServicerContext
    ) -> pb.FencedPutResponse:
        cluster = await self._check_cluster(request.cluster_id)
        sid = identifiers.check_session_id(request.session_id)
        key = keys.data(self.store, sid, records.check_data_key(request.key))
        records.check_value(request.value)
        identifiers.check_fence(request.fence)
        expected = fencing.expected_fence_value(request.fence, pb.LIVE, request.secret)
        ok, revision = await self.store.txn(
            [value_equals(keys.fence(self.store, sid), expected)], [Put(key, request.value)]
        )
        if ok:
            return pb.FencedPutResponse(revision=revision, cluster_id=cluster)
        _, record = await self.sessions.require(sid)  # classify the refusal: nothing was written
        fencing.check_grant(record, request.fence, request.secret)
        raise CoordinatorError(Reason.NOT_LIVE, "fenced writes need a live owner")

    @_handler
    @_tenant_checked
    async def FencedGet(
        self, request: pb.FencedGetRequest, context: grpc.aio.ServicerContext
    ) -> pb.FencedGetResponse:
        sid = identifiers.check_session_id(request.session_id)
        entry = await self.store.get(keys.data(self.store, sid, records.check_data_key(request.key)))
        if entry is None:
            return pb.FencedGetResponse(found=False)
        return pb.FencedGetResponse(found=True, value=entry.value, revision=entry.mod_revision)

    # --- carried state (coordinator/carry.py) -------------------------------------------
    @_handler
    @_tenant_checked
    async def BeginCarry(self, request: pb.BeginCarryRequest,
                         context: grpc.aio.ServicerContext) -> pb.BeginCarryResponse:
        cluster = await self._check_cluster(request.cluster_id)
        return pb.BeginCarryResponse(slot=await self.carried.begin(request), cluster_id=cluster)

    @_handler
    @_tenant_checked
    async def PutCarryChunk(self, request: pb.PutCarryChunkRequest,
                            context: grpc.aio.ServicerContext) -> pb.PutCarryChunkResponse:
        cluster = await self._check_cluster(request.cluster_id)
        await self.carried.put_chunk(request)
        return pb.PutCarryChunkResponse(cluster_id=cluster)

    @_handler
    @_tenant_checked
    async def CommitCarry(self, request: pb.CommitCarryRequest,
                          context: grpc.aio.ServicerContext) -> pb.CommitCarryResponse:
        cluster = await self._check_cluster(request.cluster_id)
        return pb.CommitCarryResponse(revision=await self.carried.commit(request), cluster_id=cluster)

    @_handler
    @_tenant_checked
    async def GetCarry(self, request: pb.GetCarryRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetCarryResponse:
        if request.with_chunk:
            await self._check_cluster(request.cluster_id)
        return await self.carried.get(request)

    # --- reads ---------------------------------------------------------------------------
    @_handler
    @_tenant_checked
    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        _, record = await self.sessions.require(request.session_id)
        entries, _ = await self.store.list_prefix(keys.history_prefix(self.store, record.session_id))
        history = [protojson.parse(e.value, pb.HistoryEntry) for e in entries]
        return pb.GetSessionResponse(record=record, history=history)

    @_handler
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        size = min(request.page_size or 100, MAX_PAGE)
        after = ""
        if request.page_token:
            after = self.sessions.key(identifiers.check_session_id(request.page_token))
        entries, more = await self.store.list_prefix(keys.sessions_prefix(self.store), after, size)
        page = [self.sessions.decode(e) for e in entries]
        caller = self.tenancy.caller(context)
        return pb.ListSessionsResponse(
            records=[r for r in page if caller.may_act_on(tenancy.tenant_of(r, self.tenancy.default))],
            next_page_token=page[-1].session_id if more and page else "",
        )

    # --- hosts ---------------------------------------------------------------------------
    @_handler
    async def RegisterHost(
        self, request: pb.RegisterHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterHostResponse:
        lease_id, ttl = await self.registry.register(request.registration, request.ttl_seconds)
        return pb.RegisterHostResponse(lease_id=lease_id, ttl_seconds=ttl)

    @_handler
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(
            ttl_seconds=await self.registry.heartbeat(request.host_id, request.lease_id)
        )

    @_handler
    async def ListHosts(
        self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListHostsResponse:
        hosts, draining = await self.registry.list(), await self.lifecycle.draining_hosts()
        for host in hosts:
            host.draining = host.host_id in draining
        fence_states = await self.host_fencing.states({host.host_id for host in hosts})
        return pb.ListHostsResponse(hosts=hosts, draining_host_ids=draining, fence_states=fence_states)

    # --- handoff, probes, recovery -------------------------------------------------------
    @_handler
    @_tenant_checked
    async def RequestHandoff(
        self, request: pb.RequestHandoffRequest, context: grpc.aio.ServicerContext
    ) -> pb.RequestHandoffResponse:
        identifiers.check_operation_id(request.operation_id)
        identifiers.check_host_id(request.host_id)
        requested = handoff_hash(request.operation_id)
        for _ in range(RACE_RETRIES):
            entry, record = await self.sessions.require(request.session_id)
            lease = record.lease
            if lease.handoff_stage == pb.MANUAL_RECOVERY or lease.claim_status == pb.CONFLICTED:
                raise CoordinatorError(Reason.MANUAL_RECOVERY, "session is in manual recovery; use Recover")
            if adjudication.requested_by_another(lease, requested):
                raise CoordinatorError(Reason.OPERATION_CONFLICT, "another handoff is already requested")
            if not adjudication.ask_owner(lease, requested, request.host_id):
                return pb.RequestHandoffResponse(record=record)
            if await self.sessions.transition(entry, record, "handoff-requested", request.host_id):
                return pb.RequestHandoffResponse(record=record)
        raise CoordinatorError(Reason.STALE_FENCE, "lost every race for this session; retry")

    @_handler
    @_tenant_checked
    async def ProbeSession(
        self, request: pb.ProbeSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProbeSessionResponse:
        _, record = await self.sessions.require(request.session_id)
        verdict, probe, _ = await self.sessions.judge_probed(record)
        metrics.INDETERMINATE.verdict(record.session_id, verdict.reason.value)
        return pb.ProbeSessionResponse(
            verdict=reasons.verdict(verdict.reason) or verdict.action.value,
            reason=verdict.detail,
            probe=probe,
            record=record,
        )

    @_handler
    @_tenant_checked
    async def Recover(
        self, request: pb.RecoverRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecoverResponse:
        identifiers.check_fence(request.expected_fence)
        why = lifecycle.operator_text(request.operator, request.reason)
        entry, record = await self.sessions.require(request.session_id)
        lease = record.lease
        if lease.fence != request.expected_fence:
            raise CoordinatorError(
                Reason.STALE_FENCE, f"expected fence {request.expected_fence}, current {lease.fence}"
            )
        lifecycle_rules.release_on_evidence(lease, "operator-asserted", why, now_ms())
        who = f"{request.operator} from {context.peer()}"
        if not await self.sessions.transition(entry, record, "recover", who):
            raise CoordinatorError(Reason.STALE_FENCE, "the record changed during recovery; retry")
        return pb.RecoverResponse(record=record)

    # --- lifecycle (coordinator/lifecycle.py) --------------------------------------------
    @_handler
    @_tenant_checked
    async def ArchiveSession(self, request: pb.ArchiveSessionRequest,
                             context: grpc.aio.ServicerContext) -> pb.ArchiveSessionResponse:
        return await self.lifecycle.archive(request)

    @_handler
    @_tenant_checked
    async def GetArchivedSession(self, request: pb.GetArchivedSessionRequest,
                                 context: grpc.aio.ServicerContext) -> pb.GetArchivedSessionResponse:
        return await self.lifecycle.archived(request)

    @_handler
    async def PurgeArchives(self, request: pb.PurgeArchivesRequest,
                            context: grpc.aio.ServicerContext) -> pb.PurgeArchivesResponse:
        return await self.lifecycle.purge_archives(request)

    @_handler
    async def DrainHost(self, request: pb.DrainHostRequest,
                        context: grpc.aio.ServicerContext) -> pb.DrainHostResponse:
        self.tenancy.require_all("DrainHost", context)
        return await self.lifecycle.drain(request)

    @_handler
    async def RecoverHost(self, request: pb.RecoverHostRequest,
                          context: grpc.aio.ServicerContext) -> pb.RecoverHostResponse:
        caller = self.tenancy.caller(context)
        return await self.lifecycle.recover_host(
            request, context.peer(), lambda r: caller.may_act_on(tenancy.tenant_of(r, self.tenancy.default)))

    @_handler
    async def FenceHost(self, request: pb.FenceHostRequest,
                        context: grpc.aio.ServicerContext) -> pb.FenceHostResponse:
        self.tenancy.require_all("FenceHost", context)
        return await self.host_fencing.fence_by_hand(request)

    @_handler
    async def RestoreEpoch(self, request: pb.RestoreEpochRequest,
                           context: grpc.aio.ServicerContext) -> pb.RestoreEpochResponse:
        self.tenancy.require_all("RestoreEpoch", context)
        return await self.lifecycle.restore_epoch(request)

    # --- watch ---------------------------------------------------------------------------
    @_stream_handler
    async def WatchSessions(
        self, request: pb.WatchSessionsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SessionEvent]:
        sid = request.session_id
        key = self.sessions.key(identifiers.check_session_id(sid)) if sid else None
        caller = (await self.tenancy.admit("WatchSessions", sid, context) if sid
                  else self.tenancy.caller(context))
        prefix = key or keys.sessions_prefix(self.store)
        cluster = await self.cluster.current()  # on every event: an owner checks it is its grant's
        # Another tenant's sessions are never shown, nor their deletion: a deleted record names no
        # tenant, so a deletion is shown only for an id this stream showed the caller.
        shown: set[str] = set()

        def visible(record: pb.SessionRecord) -> bool:
            if caller.may_act_on(tenancy.tenant_of(record, self.tenancy.default)):
                shown.add(record.session_id)
                return True
            return False

        while True:
            # List first, then watch from the listing's revision: after a compaction, list again.
            revision = await self.store.current_revision()
            entries, _ = await self.store.list_prefix(prefix)
            for e in entries:
                if key is None or e.key == key:
                    record = self.sessions.decode(e)
                    if visible(record):
                        yield pb.SessionEvent(record=record, resync=True, cluster_id=cluster)
            try:
                async for change in self.store.watch_prefix(prefix, revision + 1):
                    if isinstance(change, str):
                        sid = change.rsplit("/", 1)[1]
                        if (key is None or change == key) and (caller.all_tenants or sid in shown):
                            yield pb.SessionEvent(record=pb.SessionRecord(session_id=sid), deleted=True,
                                                  cluster_id=cluster)
                    elif key is None or change.key == key:
                        record = self.sessions.decode(change)
                        if visible(record):
                            yield pb.SessionEvent(record=record, cluster_id=cluster)
            except Compacted:
                continue
            return
