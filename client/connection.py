"""One connection to a coordinator, with a public method for every Coordinator RPC.

Guarantee: calls are retried (holdfast.common.retry) only where a retry is safe — Acquire replays by
operation id; a retried commit or release that finds its own effect already applied counts as
done; a call whose first try may have landed is never retried (RecordProviderHandle, archive,
recover-host, restore-epoch). Every answer to an owner's call is checked to come from its grant's
cluster. The client never calls an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from holdfast.client.errors import ClientError, classify, refused, transient
from holdfast.client.grant import Grant, same_cluster
from holdfast.client.watch_rules import reconnect, wait_s
from holdfast.common import env, identifiers, keepalive, tls, upstate
from holdfast.common.reasons import Reason, reason_of
from holdfast.common.retry import retrying
from holdfast.common.tls import Role
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

if TYPE_CHECKING:  # imported by the caller that enrolls: x509 would cost every `run` its start
    from holdfast.client.enrollment import Enroller

CALL_TIMEOUT_S = 10.0
RETRY_BUDGET_S = 5.0
OWNED = (pb.COMMITTED, pb.LIVE)


def coordinator_address(explicit: str | None = None) -> str:
    return explicit or os.environ.get(env.COORDINATOR) or upstate.DEFAULT_COORDINATOR


def local_host_id(explicit: str | None = None) -> str:
    """The id this host's agent registered under (`holdfast exec --host N` sets HOLDFAST_HOST_ID),
    checked where it is read: refused INVALID_ARGUMENT unless it is a host id (letters, digits,
    '.', '_', '-'), before anything is made with it — a takeover names the file keeping its
    operation id for it, and one with a '/' failed only after making that file's directory."""
    source, host_id = next(((said, value) for said, value in (
        ("--host-id", explicit), (env.HOST_ID, os.environ.get(env.HOST_ID))) if value),
        ("the node name", os.uname().nodename))
    try:
        return identifiers.check_host_id(host_id)
    except identifiers.InvalidInput as exc:
        raise ClientError(Reason.INVALID_ARGUMENT, f"{source}: {exc}; nothing was made or asked") from None


def client_tls_dir(explicit: str | os.PathLike[str] | None, address: str) -> Path | None:
    """--tls-dir, else $HOLDFAST_TLS_DIR, else the certificates of the `holdfast up --tls` whose
    coordinator is `address` (holdfast.common.upstate); None = plaintext."""
    chosen = tls.tls_dir(explicit)
    return chosen if chosen is not None else upstate.tls_dir_for(address)


async def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Whether the server at `address` answers a TLS ClientHello with a TLS record (a handshake or
    an alert): read from its first bytes, certificates unchecked, nothing sent past the hello."""
    import ssl  # only a plaintext call that was closed on comes here

    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    with contextlib.suppress(ssl.SSLWantReadError):
        context.wrap_bio(ssl.MemoryBIO(), outgoing).do_handshake()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except (OSError, ValueError, TimeoutError):
        return False
    try:
        writer.write(outgoing.read())
        first = await asyncio.wait_for(reader.read(2), timeout)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
    # A TLS record: content type 22 (handshake) or 21 (alert), then major version 3.
    return len(first) == 2 and first[0] in (21, 22) and first[1] == 3


def not_the_caller(pid: int, session: str) -> None:
    """A session's owner is a child this process spawned behind its gate, never this process: only a
    child's whole tree can be attested by its spawn token, held in a session cgroup and proven ended."""
    if pid == os.getpid():
        raise ClientError(Reason.INVALID_ARGUMENT, f"pid {pid} is this process itself: holdfast commits a "
                          "child it spawned behind its gate (CMD), never the caller's own pid; run the "
                          "writer as CMD (holdfast.client.session)", session)


@dataclass(frozen=True)
class Held:
    """A Hold call past its grant: the owner's watch of the record from the grant's revision on."""

    call: grpc.aio.UnaryStreamCall
    fence: int
    revision: int


@dataclass
class Outage:
    """What a watch says of the ends it reconnects after: `lost` once per reason in one outage (a
    line per attempt would flood a run's stderr for as long as the outage lasts), `back` once the
    watch delivers again after one."""

    lost: Callable[[ClientError], None] | None = None
    back: Callable[[], None] | None = None
    said: set[str] = field(default_factory=set)
    attempt: int = 0

    def failed(self, err: ClientError) -> None:
        if self.lost is not None and str(err.reason) not in self.said:
            self.lost(err)
        self.said.add(str(err.reason))

    def delivered(self) -> None:
        if self.said and self.back is not None:
            self.back()
        self.said.clear()
        self.attempt = 0


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a call ending with `code` raises, for an end a stream has without one (its first
    answer late, or no status at all), so it is classified and said as any other."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def deadline_exceeded() -> grpc.aio.AioRpcError:
    """What a unary call's own deadline raises, for a stream whose first answer is late."""
    return rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


class Client:
    """One channel to a coordinator, with the calls a runtime and an operator need."""

    def __init__(self, address: str | None = None, host_id: str | None = None,
                 tls_dir: str | os.PathLike[str] | None = None, role: str = "client",
                 enroller: Enroller | None = None) -> None:
        """`role` picks the certificate presented with TLS (`<role>.pem` in the directory): a
        runtime is `client`; the operator commands present `operator` (docs/design.md §4). With
        `enroller`, the pair it installed in its directory (a session pod's own; `renewed`)."""
        self.address = coordinator_address(address)
        self.host_id = local_host_id(host_id)
        self.role = Role(role)
        self.enroller = enroller
        self.tls_dir = enroller.tls_dir if enroller is not None else client_tls_dir(tls_dir, self.address)
        self.channel = self._open()
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        # Channels presenting a certificate since renewed: their calls go on until the client closes.
        self.retired: list[grpc.aio.Channel] = []
        # Connecting (TCP, HTTP/2 settings, TLS) starts now, on grpc's own threads, while `run` does
        # its local work (CMD resolved, grant directory, gate spawned): the first call no longer waits
        # for it. 1.2 ms from the gate's spawn to the Acquire reaching the coordinator, not 2.7-4.9.
        self.channel.get_state(try_to_connect=True)
        # Until some call was answered, a refused connection means nothing listens at the address:
        # say so at once, not after seconds of retries. Once answered, a refusal is a coordinator
        # restarting under a run, and the retry budget rides over it.
        self.answered = False
        # A plaintext call the server closed, probed and found to be TLS: no retry can mend that
        # (it cost 5.7 s of retries to say UNREACHABLE, with the advice to start a coordinator).
        self.speaks_tls = False
        # Each session's Hold call past its grant, until its owner watches on it or lets it go.
        self.held: dict[str, Held] = {}
        self.holds = True  # the coordinator serves Hold (an older one answers UNIMPLEMENTED)

    def _open(self) -> grpc.aio.Channel:
        if self.enroller is not None:
            return grpc.aio.secure_channel(self.address, self.enroller.credentials(),
                                           options=keepalive.channel_options())
        try:
            return tls.open_channel(self.address, self.tls_dir, self.role)
        except FileNotFoundError as missing:  # its message names the file and how to make it
            raise ClientError(Reason.TLS_FILE_MISSING, str(missing)) from None
        except OSError as refused:  # another user's file, link or FIFO (files.read_tls_file): never read
            error = ClientError(Reason.TLS_FILE_MISSING, f"{refused.filename}: {refused.strerror}; not read")
            # The file is there: making another with `certs init` (the table's step) would mint a new CA.
            error.hint = ("fix that file as said (its owner, mode, names or link), or point --tls-dir / "
                          "HOLDFAST_TLS_DIR at a directory of this user's")
            raise error from None
        except ValueError as wrong:  # HOLDFAST_KEEPALIVE_SECONDS, named in the message
            raise ClientError(Reason.INVALID_ARGUMENT, str(wrong)) from None

    async def renewed(self) -> None:
        """The certificate was renewed: later calls, and a watch's reconnect, go on a channel
        presenting the new one (a channel keeps its certificate, and an expired one fails every
        reconnect). The old channel is not closed until the client is: closing a channel cancels its
        calls — an Acquire waiting for its session, the owner's watch — as if `run` were interrupted.
        Idle, it holds no connection (gRPC's client idle timeout)."""
        old, self.channel = self.channel, self._open()
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        self.retired.append(old)

    def _retryable(self, exc: BaseException) -> bool:
        return transient(exc) and (self.answered or not refused(exc)) and not self.speaks_tls

    async def close(self) -> None:
        for channel in [*self.retired, self.channel]:
            await channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method, request, session: str = "", timeout: float = CALL_TIMEOUT_S,  # type: ignore[no-untyped-def]
                    retry: bool = True):
        """One RPC, retried while nothing answers (`retry` only for calls that are safe to repeat).
        A ClientError says whether an earlier try was sent, whose effect may have landed."""
        tries = 0

        async def attempt():  # type: ignore[no-untyped-def]
            nonlocal tries
            tries += 1
            try:
                return await method(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if (self.tls_dir is None and not self.answered and transient(exc) and not refused(exc)
                        and not reason_of(exc)):
                    self.speaks_tls = await speaks_tls(self.address)
                raise

        try:
            response = await retrying(attempt, self._retryable if retry else lambda _exc: False,
                                      budget_s=RETRY_BUDGET_S)
        except grpc.aio.AioRpcError as exc:
            self.answered = self.answered or bool(reason_of(exc))
            error = (ClientError(Reason.TLS_REQUIRED, f"the coordinator at {self.address} speaks TLS, and "
                                 "this call was plaintext", session) if self.speaks_tls
                     else classify(exc, session, self.address, plaintext=self.tls_dir is None))
            error.retried = tries > 1
            raise error from None
        self.answered = True
        return response

    # --- owner calls ---------------------------------------------------------------------
    async def acquire(self, session_id: str, operation_id: str, *, provider: str = "", location: str = "",
                      wait_seconds: float = 0.0, takeover: bool = False, force: bool = False,
                      live_on_commit: bool = True, await_release: bool = False,
                      gate: pb.GateSpawn | None = None, hold: bool = False) -> tuple[Grant, pb.SessionRecord]:
        """The grant, and the record as granted: with `gate`, its owner already that gate when the
        coordinator could attest it (commit at grant), else a reservation for `commit`. With `hold`,
        the call stays open past the grant, and `watch` with this grant from its revision reads the
        record's changes from it: no watch call of its own."""
        if gate is not None:
            not_the_caller(gate.pid_hint, session_id)
        try:
            identifiers.check_acquire_flags(force, await_release)
        except identifiers.InvalidInput as wrong:
            raise ClientError(Reason.INVALID_ARGUMENT, str(wrong), session_id) from None
        request = pb.AcquireRequest(
            session_id=session_id, provider=provider, location=location, operation_id=operation_id,
            host_id=self.host_id, live_on_commit=live_on_commit, wait_seconds=wait_seconds,
            takeover=takeover, force=force, await_release=await_release, gate=gate,
        )
        self.let_go(session_id)
        # A replay with the same operation id returns the first grant, so the retry is safe.
        timeout = wait_seconds + CALL_TIMEOUT_S
        try:
            response = await self._call(self._hold if hold and self.holds else self.stub.Acquire, request,
                                        session_id, timeout)
        except ClientError as err:
            if err.reason != grpc.StatusCode.UNIMPLEMENTED.name or not hold or not self.holds:
                raise
            self.holds = False  # refused before anything was read: Acquire asks the same
            response = await self._call(self.stub.Acquire, request, session_id, timeout)
        g = response.grant
        grant = Grant(g.session_id, g.fence, g.secret, g.spawn_token, g.spawn_token_env, self.address,
                      g.cluster_id, response.revision)
        return grant, response.record

    async def _hold(self, request: pb.AcquireRequest, timeout: float) -> pb.AcquireResponse:
        """Hold's first answer, the Acquire's, within `timeout` as an Acquire's; the call is kept."""
        call = self.stub.Hold(request)
        try:
            first = await asyncio.wait_for(call.read(), timeout)
        except TimeoutError:
            call.cancel()
            raise deadline_exceeded() from None
        except BaseException:
            call.cancel()
            raise
        if first is grpc.aio.EOF:  # ended without an answer or a status: no coordinator does
            raise rpc_error(grpc.StatusCode.INTERNAL, "Hold ended without an answer")
        granted = first.granted
        self.held[request.session_id] = Held(call, granted.grant.fence, granted.revision)
        return granted

    def let_go(self, session_id: str) -> None:
        """Ends the session's Hold call, if one is kept: nobody will watch on it."""
        held = self.held.pop(session_id, None)
        if held is not None:
            held.call.cancel()

    async def request_handoff(self, session_id: str, operation_id: str) -> pb.SessionRecord | None:
        """None when the session has no record yet (nothing to hand off)."""
        request = pb.RequestHandoffRequest(session_id=session_id, operation_id=operation_id,
                                           host_id=self.host_id)
        try:
            return (await self._call(self.stub.RequestHandoff, request, session_id)).record
        except ClientError as err:
            if err.reason == Reason.NOT_FOUND:
                return None
            raise

    async def commit(self, grant: Grant, pid_hint: int,
                     is_ours: Callable[[apb.ProcessIdentity], bool]) -> pb.SessionRecord:
        """Commits the reservation to the process at `pid_hint`; `is_ours` tells that process's
        attested identity from any other's (client.gate.Gate.is_process)."""
        not_the_caller(pid_hint, grant.session_id)
        request = pb.CommitOwnerRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                        pid_hint=pid_hint, cluster_id=grant.cluster_id)
        try:
            response = await self._call(self.stub.CommitOwner, request, grant.session_id)
            same_cluster(grant, response.cluster_id)
            return response.record
        except ClientError as err:
            # A retried commit whose first try landed finds no reservation: check that it is ours,
            # by the committed process, not by the token (two gates can carry a replayed one).
            record = await self._own_effect(grant, err, lambda lease: lease.claim_status in OWNED and
                                            lease.owner.spawn_token == grant.spawn_token and
                                            is_ours(lease.owner))
            if record is None:
                raise
            return record

    async def release(self, grant: Grant) -> pb.SessionRecord:
        self.let_go(grant.session_id)
        request = pb.ReleaseRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                    cluster_id=grant.cluster_id)
        try:
            response = await self._call(self.stub.Release, request, grant.session_id)
            same_cluster(grant, response.cluster_id)
            return response.record
        except ClientError as err:
            record = await self._own_effect(grant, err, lambda lease: lease.claim_status == pb.RELEASED)
            if record is None:
                raise
            return record

    async def _own_effect(self, grant: Grant, err: ClientError,
                          applied: Callable[[pb.Lease], bool]) -> pb.SessionRecord | None:
        # Only a retry can find its own first try's effect; otherwise the effect is someone else's.
        if err.reason != Reason.STALE_FENCE or not err.retried:
            return None
        record = (await self.get_session(grant.session_id)).record
        return record if record.lease.fence == grant.fence and applied(record.lease) else None

    async def fenced_put(self, grant: Grant, key: str, value: bytes) -> int:
        request = pb.FencedPutRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                      key=key, value=value, cluster_id=grant.cluster_id)
        response = await self._call(self.stub.FencedPut, request, grant.session_id)
        same_cluster(grant, response.cluster_id)
        return response.revision

    async def record_provider_handle(self, grant: Grant, handle: str) -> pb.SessionRecord:
        request = pb.RecordProviderHandleRequest(session_id=grant.session_id, fence=grant.fence,
                                                 secret=grant.secret, handle=handle,
                                                 cluster_id=grant.cluster_id)
        # Not retried: a second try whose first landed would append the handle twice.
        response = await self._call(self.stub.RecordProviderHandle, request, grant.session_id, retry=False)
        same_cluster(grant, response.cluster_id)
        return response.record

    # --- carried state (holdfast.client.carry packs and restores it) ----------------------
    async def begin_carry(self, grant: Grant, total_bytes: int, chunks: int) -> int:
        """Reserves space for a new copy beside the last good one; the slot to fill. Safe to retry:
        a second try reserves the same slot afresh."""
        request = pb.BeginCarryRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                       cluster_id=grant.cluster_id, total_bytes=total_bytes, chunks=chunks)
        response = await self._call(self.stub.BeginCarry, request, grant.session_id)
        same_cluster(grant, response.cluster_id)
        return response.slot

    async def put_carry_chunk(self, grant: Grant, slot: int, index: int, data: bytes) -> None:
        request = pb.PutCarryChunkRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                          cluster_id=grant.cluster_id, slot=slot, index=index, data=data)
        response = await self._call(self.stub.PutCarryChunk, request, grant.session_id)  # idempotent
        same_cluster(grant, response.cluster_id)

    async def commit_carry(self, grant: Grant, manifest: pb.CarryManifest) -> int:
        request = pb.CommitCarryRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                        cluster_id=grant.cluster_id, manifest=manifest)
        # Not retried: a first try that landed leaves the slot named, and the retry would be refused.
        response = await self._call(self.stub.CommitCarry, request, grant.session_id, retry=False)
        same_cluster(grant, response.cluster_id)
        return response.revision

    async def get_carry(self, session_id: str, with_budget: bool = False) -> pb.GetCarryResponse:
        """The session's carry manifest and the coordinator's per-session cap; `with_budget`: also
        the carry budgets of the session's tenant and of the cluster, with their use."""
        return await self._call(self.stub.GetCarry, pb.GetCarryRequest(session_id=session_id,
                                                                       with_budget=with_budget), session_id)

    async def get_carry_chunk(self, grant: Grant, slot: int, index: int) -> pb.GetCarryResponse:
        """The manifest and chunk `index` of `slot`: the session's content, for its committed owner."""
        request = pb.GetCarryRequest(session_id=grant.session_id, with_chunk=True, slot=slot, index=index,
                                     fence=grant.fence, secret=grant.secret, cluster_id=grant.cluster_id)
        return await self._call(self.stub.GetCarry, request, grant.session_id)

    # --- reads and operator calls ----------------------------------------------------------
    async def fenced_get(self, session_id: str, key: str) -> pb.FencedGetResponse:
        return await self._call(self.stub.FencedGet, pb.FencedGetRequest(session_id=session_id, key=key),
                                session_id)

    async def get_session(self, session_id: str) -> pb.GetSessionResponse:
        return await self._call(self.stub.GetSession, pb.GetSessionRequest(session_id=session_id), session_id)

    async def list_sessions(self) -> list[pb.SessionRecord]:
        found: list[pb.SessionRecord] = []
        token = ""
        while True:
            page = await self._call(self.stub.ListSessions, pb.ListSessionsRequest(page_size=500,
                                                                                   page_token=token))
            found.extend(page.records)
            token = page.next_page_token
            if not token:
                return found

    async def list_hosts(self) -> list[pb.HostRegistration]:
        """The registered hosts, each with its drain flag."""
        return list((await self.host_listing()).hosts)

    async def host_listing(self) -> pb.ListHostsResponse:
        """ListHosts whole: the registered hosts, and every draining host, registered or not."""
        return await self._call(self.stub.ListHosts, pb.ListHostsRequest())

    async def probe(self, session_id: str) -> pb.ProbeSessionResponse:
        return await self._call(self.stub.ProbeSession, pb.ProbeSessionRequest(session_id=session_id),
                                session_id, timeout=30.0)

    async def recover(self, session_id: str, fence: int, reason: str, operator: str) -> pb.SessionRecord:
        request = pb.RecoverRequest(session_id=session_id, expected_fence=fence, reason=reason,
                                    operator=operator)
        return (await self._call(self.stub.Recover, request, session_id)).record

    # --- lifecycle (operator and maintenance calls) -------------------------------------------------
    async def drain(self, host_id: str, operator: str, draining: bool = True) -> pb.DrainHostResponse:
        # Safe to repeat: a second drain finds the handoffs already requested.
        request = pb.DrainHostRequest(host_id=host_id, draining=draining, operator=operator)
        return await self._call(self.stub.DrainHost, request)

    async def archive(self, session_id: str, fence: int, operator: str,
                      reason: str) -> pb.ArchiveSessionResponse:
        request = pb.ArchiveSessionRequest(session_id=session_id, expected_fence=fence, operator=operator,
                                           reason=reason)
        return await self._call(self.stub.ArchiveSession, request, session_id, retry=False)

    async def archived(self, session_id: str) -> pb.GetArchivedSessionResponse:
        request = pb.GetArchivedSessionRequest(session_id=session_id)
        return await self._call(self.stub.GetArchivedSession, request, session_id)

    async def purge_archives(self, older_than_seconds: int, limit: int) -> pb.PurgeArchivesResponse:
        request = pb.PurgeArchivesRequest(older_than_seconds=older_than_seconds, limit=limit)
        return await self._call(self.stub.PurgeArchives, request, timeout=60.0)

    async def recover_host(self, host_id: str, reason: str, operator: str) -> pb.RecoverHostResponse:
        request = pb.RecoverHostRequest(host_id=host_id, reason=reason, operator=operator)
        return await self._call(self.stub.RecoverHost, request, retry=False, timeout=60.0)

    async def fence_host(self, host_id: str, reason: str, operator: str) -> pb.FenceHostResponse:
        """Powers HOST off through the coordinator's configured fencer and, on proof, frees its sessions.
        Never retried: a second attempt is the operator's decision."""
        request = pb.FenceHostRequest(host_id=host_id, reason=reason, operator=operator)
        return await self._call(self.stub.FenceHost, request, retry=False, timeout=300.0)

    async def restore_epoch(self, epoch: int, operator: str, reason: str,
                            expected_hosts: list[str]) -> pb.RestoreEpochResponse:
        request = pb.RestoreEpochRequest(epoch=epoch, operator=operator, reason=reason,
                                         expected_hosts=expected_hosts)
        return await self._call(self.stub.RestoreEpoch, request, retry=False, timeout=300.0)

    async def watch(self, session_id: str, grant: Grant | None = None, after_revision: int = 0,
                    lost: Callable[[ClientError], None] | None = None,
                    back: Callable[[], None] | None = None) -> AsyncGenerator[pb.SessionRecord, None]:
        """The session's record now and at every change; reconnects after every end that may pass
        (client.watch_rules), calling `lost` and `back` as `session_events` does. With `grant`, an
        event from another cluster than the grant's raises WRONG_CLUSTER. With `after_revision` (the
        caller holds the record as of it), only the changes after it: read from the grant's Hold
        call when one is kept for exactly that grant and revision."""
        held = self.held.get(session_id)
        outage = Outage(lost, back)
        if held is not None and grant is not None and (held.fence, held.revision) == (grant.fence,
                                                                                       after_revision):
            del self.held[session_id]
            events = self._held_events(held.call, session_id, outage)
        else:
            events = self._events(session_id, outage, after_revision)
        async for event in events:
            if grant is not None:
                same_cluster(grant, event.cluster_id)
            if event.HasField("record") and not event.deleted:  # the opening one of after_revision has none
                yield event.record

    def _ended(self, exc: grpc.aio.AioRpcError, session_id: str, outage: Outage) -> float:
        """The wait before a watch ended by `exc` asks again (said through `outage`); raises the
        ClientError of an end that cannot pass (client.watch_rules)."""
        err = classify(exc, session_id, self.address, plaintext=self.tls_dir is None)
        pace = reconnect(exc.code(), reason_of(exc))
        if pace is None:
            raise err from None
        outage.failed(err)
        outage.attempt += 1
        return wait_s(pace, outage.attempt - 1, random.random())

    async def _held_events(self, call: grpc.aio.UnaryStreamCall, session_id: str,
                           outage: Outage) -> AsyncIterator[pb.SessionEvent]:
        """The changes on a Hold call; once it ends as a watch reconnects (a coordinator going away),
        the record as it is then and its changes, as `session_events` reconnects."""
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                yield message.change
        except grpc.aio.AioRpcError as exc:
            self._ended(exc, session_id, outage)  # asked again at once: a Hold ends only once
        finally:
            call.cancel()
        async for event in self._events(session_id, outage):
            yield event

    async def session_events(self, session_id: str = "",
                             lost: Callable[[ClientError], None] | None = None,
                             after_revision: int = 0,
                             back: Callable[[], None] | None = None) -> AsyncIterator[pb.SessionEvent]:
        """Every session's (or one session's) records now (`resync`), then each change; reconnects
        after every end that may pass (client.watch_rules: a coordinator away, a refusal of the
        moment such as TOO_MANY_CALLS), starting again with the records as they are then, and calls
        `lost` with why once per reason per outage and `back` once an event came through after it.
        An end that cannot pass raises its ClientError. With `after_revision`, the first call lists
        nothing: the changes after it. Every reconnect lists: the coordinator that answers next may
        serve an etcd restored from a snapshot, whose revisions are below the grant's and reused by
        another history, where a watch from `after_revision` shows nothing."""
        async for event in self._events(session_id, Outage(lost, back), after_revision):
            yield event

    async def _events(self, session_id: str, outage: Outage,
                      after_revision: int = 0) -> AsyncIterator[pb.SessionEvent]:
        while True:
            call = self.stub.WatchSessions(pb.WatchSessionsRequest(session_id=session_id,
                                                                   after_revision=after_revision))
            after_revision = 0
            try:
                async for event in call:
                    outage.delivered()
                    yield event
                # No coordinator ends a watch without a status; one that did would leave an owner
                # not watching and not saying so: said, and asked again as a refusal is.
                wait = self._ended(rpc_error(grpc.StatusCode.INTERNAL, "the watch ended without a "
                                             "status"), session_id, outage)
            except grpc.aio.AioRpcError as exc:
                wait = self._ended(exc, session_id, outage)
            finally:
                call.cancel()
            await asyncio.sleep(wait)
