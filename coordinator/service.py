"""The Coordinator gRPC servicer: stateless over etcd, so any number of replicas behave as one.

Guarantee: only Acquire mints a fence, token and secret; every transition is one etcd transaction
comparing the record's mod revision and every other key its decision read (docs/transactions.md),
and rewriting `fence/<id>`; every fenced write is one transaction comparing `fence/<id>`; a refusal
writes nothing and signals nothing (a forced Acquire kills only after a `force-pending` transition
that compares every precondition of the grant); indeterminate never grants.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from holdfast.common import identifiers, reasons, tls
from holdfast.common.reasons import Reason
from holdfast.coordinator import (
    acquire,
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
from holdfast.coordinator.acquire import RACE_RETRIES, handoff_hash
from holdfast.coordinator.call_limits import DEFAULT_CALL_LIMITS, CallLimits, OpenCalls
from holdfast.coordinator.carry_budget_rules import DEFAULT_LIMITS, CarryLimits
from holdfast.coordinator.cluster import ClusterIdentity
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.host_fencing import FencingSettings, HostFencing
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.replays import ReplayLease
from holdfast.coordinator.reservations import ReservationClock
from holdfast.coordinator.routing import Router
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import (
    Compacted,
    Entry,
    Put,
    Seen,
    Store,
    StoreUnavailable,
    TooLarge,
    value_equals,
)
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

COMMIT_WINDOW_MS = 30_000
MAX_CHAIN = 256
MAX_PAGE = 500
MAX_REVISION = 2**63 - 1  # etcd's revisions are int64: a watch starts at after_revision + 1
# How far behind the newest revision the store has seen an after_revision may be and still be
# watched from: etcd reads every change of every key since a watch's start to find its events (an
# hour of history, ~1.5 KB a revision, in memory at once), so an older one lists instead. An owner
# opens its watch milliseconds after its grant; one slower than this only pays one Range.
MAX_REPLAY = 10_000


REFUSED = (identifiers.InvalidInput, StoreUnavailable, TooLarge, CoordinatorError)


async def _refuse(rpc: str, exc: identifiers.InvalidInput | StoreUnavailable | TooLarge | CoordinatorError,
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
    elif isinstance(exc, TooLarge):
        # A record grown past what one etcd request takes (a provider handle chain recorded before
        # MAX_CHAIN_BYTES) would otherwise fail every later call on the session as UNKNOWN.
        error = CoordinatorError(Reason.RECORD_TOO_LARGE, f"{exc}; nothing was written")
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
    """`_handler` for a server-streaming call: a domain error ends the stream with its status. Each
    holds one of its caller's and its tenant's slots (call_limits) while it is open, taken before
    anything is read."""
    open_now = metrics.STREAMS_OPEN.labels(fn.__name__)

    async def wrapped(self: CoordinatorService, request: object,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        try:
            with self.open_calls.slot(fn.__name__, context, self.tenancy.caller(context)):
                open_now.inc()
                try:
                    async for item in fn(self, request, context):
                        yield item
                finally:
                    open_now.dec()
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
        if await self.tenancy.admit(fn.__name__, request.session_id, context) is None:
            return self._unheld(request)
        return await fn(self, request, context)

    wrapped.__name__ = fn.__name__
    return wrapped


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, store: Store, agent_tls_dir: Path | None = None,
                 commit_window_ms: int = COMMIT_WINDOW_MS, carry_limits: CarryLimits = DEFAULT_LIMITS,
                 fencing: FencingSettings | None = None,
                 name: str = "", default_tenant: str = tenancy.DEFAULT_TENANT,
                 call_limits: CallLimits = DEFAULT_CALL_LIMITS) -> None:
        self.store = store
        self.tenancy = tenancy.Tenancy(store, default_tenant)
        self.open_calls = OpenCalls(call_limits)
        self.commit_window_ms = commit_window_ms
        self.registry = Registry(store)
        self.router = Router(agent_tls_dir)
        self.sessions = Sessions(store, self.registry, self.router)
        self.carried = carry.CarryStore(self.sessions, carry_limits, default_tenant)
        self.lifecycle = lifecycle.Lifecycle(self.sessions, self.carried)
        self.host_fencing = HostFencing(self.lifecycle, fencing or FencingSettings(), name)
        self.replays = ReplayLease(store)
        self.cluster = ClusterIdentity(store)
        self.acquiring = acquire.Parts(store, self.registry, self.router, self.sessions, self.replays,
                                       self.cluster, self.tenancy, ReservationClock(), commit_window_ms)

    def _unheld(self, request: Any) -> object:
        """The answer to a caller of one tenant on an id no tenant holds, read from nothing
        (coordinator/tenancy.py: another tenant may make the id meanwhile): the same answer as for
        an id that was never acquired."""
        if isinstance(request, pb.FencedGetRequest):
            return pb.FencedGetResponse(found=False)
        if isinstance(request, pb.GetCarryRequest) and not request.with_chunk:
            return pb.GetCarryResponse(session_cap_bytes=self.carried.session_cap)
        raise CoordinatorError(Reason.NOT_FOUND, f"unknown session {request.session_id}")

    async def _check_cluster(self, cluster_id: str) -> str:
        """A grant minted by another holdfast cluster is refused before anything is read or written;
        empty is an older client's request, accepted. Returns this cluster's identity."""
        ours = await self.cluster.current()
        if cluster_id and cluster_id != ours:
            raise CoordinatorError(Reason.WRONG_CLUSTER, f"this grant was minted by holdfast cluster "
                                   f"{cluster_id[:64]!r}; this coordinator serves {ours!r}. Nothing was "
                                   "written")
        return ours

    # --- acquisition (coordinator/acquire.py) --------------------------------------------------
    @_handler
    async def Acquire(
        self, request: pb.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireResponse:
        # A slot for every Acquire, before anything is read: whether it will wait is known only
        # once it has read the session.
        with self.open_calls.slot("Acquire", context, self.tenancy.caller(context)):
            return await acquire.Acquisition(self.acquiring, request, context).run()

    @_stream_handler
    async def Hold(
        self, request: pb.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HoldEvent]:
        granted = await acquire.Acquisition(self.acquiring, request, context).run()
        yield pb.HoldEvent(granted=granted)
        # The owner's watch, judged as WatchSessions judges each record; the acquisition checked the
        # id and judged the caller for it. Its opening event, a bare cluster id, `granted` told.
        changes = self._changes(self.sessions.key(request.session_id), granted.revision,
                                self.tenancy.caller(context))
        async for event in changes:
            if event.HasField("record"):
                yield pb.HoldEvent(change=event)

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
        # A commit starts CMD: it passes the grant's gates as a grant does, so a reservation made
        # before a drain (or a restore) never starts CMD on the draining host (or beside the
        # restore's orphan search, which counts every reservation's carrier an orphan). Compared in
        # the commit, so a gate closing after this reading makes the commit lose.
        gates, _ = await grant_gates.read(self.store, self.registry, lease.reserved_host_id)
        gates.judge()
        # The attestation is the reserved host's registered agent's: compared, so an agent that
        # re-registered meanwhile (another incarnation, another token variable) makes it retry.
        attested = await attestation.attest(
            self.router, lease.reserved_host_id, gates.registration,
            lease.reserved_spawn_token, lease.spawn_token_env, request.pid_hint, record.session_id,
            lease.fence)
        identity = attested.identity
        attestation.commit(lease, identity, now_ms())
        committed = f"pid {identity.pid} on {identity.host_id}"
        if not await self.sessions.transition(entry, record, "commit", committed,
                                              reads=gates.reads):
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
        link = pb.ProviderHandleLink(handle=request.handle, minted_at_fence=request.fence,
                                     observed_at_unix_ms=now_ms())
        size = records.chain_bytes([*record.provider_handle_chain, link])
        if size > records.MAX_CHAIN_BYTES:
            raise CoordinatorError(Reason.CHAIN_FULL, (
                f"the provider handle chain would take {size} bytes; it holds at most "
                f"{records.MAX_CHAIN_BYTES} bytes of handles: start a new session id"))
        record.provider_handle_chain.append(link)
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
        release = functools.partial(self._release, request, self.tenancy.caller(context))
        released = await self.sessions.on_latest(request.session_id, release)
        if released is None:
            raise CoordinatorError(Reason.STALE_FENCE, "the record changed during release")
        return pb.ReleaseResponse(record=released, cluster_id=cluster)

    async def _release(self, request: pb.ReleaseRequest, caller: tenancy.Caller, entry: Entry,
                       record: pb.SessionRecord, reads: list[Seen]) -> pb.SessionRecord | None:
        """The release on the record as `entry` holds it; None when its transaction lost."""
        self.tenancy.judge("Release", record.session_id, record, caller)  # tenancy.JUDGED_ON_READ
        fencing.check_grant(record, request.fence, request.secret)
        lease = record.lease
        if lease.claim_status in (pb.COMMITTED, pb.LIVE):
            probe, registration = await self.sessions.probe(lease.owner)
            reads = [*reads, registration]
            if not adjudication.release_allowed(lease, probe):
                raise CoordinatorError(*adjudication.release_refusal(lease, probe))
        elif lease.claim_status != pb.RESERVED:
            raise CoordinatorError(Reason.STALE_FENCE, "this grant is no longer held")
        lease.claim_status = pb.RELEASED
        adjudication.answer_drain_request(lease)
        lease.death_evidence.CopyFrom(
            pb.DeathEvidence(kind="released", observed_at_unix_ms=now_ms(), owner_fence=lease.fence)
        )
        return record if await self.sessions.transition(entry, record, "release", reads=reads) else None

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
        caller = self.tenancy.caller(context)
        shown: list[pb.SessionRecord] = []
        more = True
        # Read on past other tenants' sessions until one record beyond the page is the caller's or
        # none is left: the token is then the last session shown, and a token at all says only that
        # more of the caller's own follow (the last key read, as a token, would name another
        # tenant's session to a caller paging one record at a time).
        while more and len(shown) <= size:
            entries, more = await self.store.list_prefix(keys.sessions_prefix(self.store), after, MAX_PAGE)
            shown += [record for record in map(self.sessions.decode, entries)
                      if caller.may_act_on(tenancy.tenant_of(record, self.tenancy.default))]
            after = entries[-1].key if entries else after
            more = more and bool(entries)
        return pb.ListSessionsResponse(
            records=shown[:size], next_page_token=shown[size - 1].session_id if len(shown) > size else "")

    # --- hosts ---------------------------------------------------------------------------
    @_handler
    async def RegisterHost(
        self, request: pb.RegisterHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterHostResponse:
        lease_id, ttl = await self.registry.register(request.registration, request.ttl_seconds,
                                                     tls.peer_node_uid(context))
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
        return await self.lifecycle.purge_archives(request, self.tenancy.retention_scope(context))

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
            request, context.peer(), lambda r: caller.may_act_on(tenancy.tenant_of(r, self.tenancy.default)),
            caller.all_tenants)

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
        sid, after = request.session_id, request.after_revision
        key = self.sessions.key(identifiers.check_session_id(sid)) if sid else None
        # An int64's top is no revision a grant answered: the watch would start past it.
        if not 0 <= after < MAX_REVISION or (after and key is None):
            raise identifiers.InvalidInput(f"after_revision must be ≥ 0 and below {MAX_REVISION}, and only "
                                           "with a session_id")
        if sid:
            # WRONG_TENANT for another tenant's id; one no tenant holds yet is watched all the same,
            # for every record below is judged as it comes.
            await self.tenancy.admit("WatchSessions", sid, context)
        async for event in self._changes(key, after, self.tenancy.caller(context)):
            yield event

    def _tenant_of(self, entry: Entry) -> str | None:
        """A changed record's tenant; None when it does not decode (every call then reads it, and
        fails on it as it would have)."""
        try:
            return tenancy.tenant_of(self.sessions.shared(entry), self.tenancy.default)
        except (ValueError, json_format.ParseError):
            return None

    async def _changes(self, key: str | None, after: int,
                       caller: tenancy.Caller) -> AsyncIterator[pb.SessionEvent]:
        """One session's (`key`) or every session's record and changes, as `caller` may see them."""
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
            # List first, then watch from the listing's revision (one Range: its answer's header
            # revision is the one the listing was read at): after a compaction, list again. A caller
            # that holds the record as of `after` (an owner, as its grant wrote it) needs no listing:
            # every change after it comes on the watch, and a compaction past it lists as above.
            revision = after if after > self.store.newest - MAX_REPLAY else 0
            held = revision  # the caller's: past etcd's own, another history's (a restore), so list
            if revision:
                # No record to send, but the cluster answering: an owner whose address now reaches
                # another holdfast cluster hears it at once (WRONG_CLUSTER), as a listing told it.
                yield pb.SessionEvent(cluster_id=cluster)
            else:
                # A page at a time, each let go once sent: a caller that stops reading keeps one
                # page of every tenant's records here, not the whole listing, and the watch after
                # it keeps none. Compacted before the last page: list again (a record sent twice is
                # a resync twice).
                listed: set[str] = set()
                try:
                    async with contextlib.aclosing(self.store.snapshot_pages(prefix)) as pages:
                        async for page, listed_at in pages:
                            revision = listed_at
                            for e in page:
                                if key is None or e.key == key:
                                    # Not the watches' shared decodings: a listing
                                    # of every record would push out the changes they keep.
                                    record = self.sessions.decode(e)
                                    if visible(record):
                                        listed.add(record.session_id)
                                        yield pb.SessionEvent(record=record, resync=True, cluster_id=cluster)
                            page.clear()
                except Compacted:
                    continue
                # A re-listing (after a compaction, or the budget ending the watch) replaces what
                # the caller was shown: an id shown before and not listed now was deleted (or is
                # no longer the caller's to see) while its deletion could not come on the watch.
                for sid in sorted(shown - listed):
                    shown.discard(sid)
                    yield pb.SessionEvent(record=pb.SessionRecord(session_id=sid), deleted=True,
                                          cluster_id=cluster)
            after = 0
            # One session's watch (an owner's of its own) is served from this replica's one watch of
            # every session when it can be: no watch of its own at etcd.
            # Every session's: from that one watch too, each change decoded and tagged with its tenant
            # once for every such call, and handed only to the calls that may see it (a deletion,
            # to those its record's put was): another tenant's changes cost a call nothing (they
            # cost ~38 µs per call per change). A record's tenant is its id's for the record's life.
            changes = (self.store.watch_key(key, revision + 1, held) if key
                       else self.store.watch_tagged(prefix, revision + 1, self._tenant_of,
                                                    None if caller.all_tenants else caller.tenant))
            try:
                async for change in changes:
                    if isinstance(change, str):
                        sid = change.rsplit("/", 1)[1]
                        if (key is None or change == key) and (caller.all_tenants or sid in shown):
                            # Shown no longer: the id's next holder may be another tenant, whose
                            # deletion of it is not this caller's, and a re-listing must not say
                            # this one twice.
                            shown.discard(sid)
                            yield pb.SessionEvent(record=pb.SessionRecord(session_id=sid), deleted=True,
                                                  cluster_id=cluster)
                    elif key is None or change.key == key:
                        record = self.sessions.shared(change)
                        if visible(record):
                            yield pb.SessionEvent(record=record, cluster_id=cluster)
            except Compacted:
                continue
            return
