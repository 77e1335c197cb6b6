"""Calls to the owner host's agent (docs/design.md §4): only coordinators call agents.

Guarantee: a host without registration, an unreachable agent or a timeout yields an INDETERMINATE
probe result naming that reason — after bounded retries — never a proof of death. Each call
goes to the address of the registration its caller read and compares in its decision's
transaction, never to one read again here: the agent that answered is the one the decision names,
and a probe costs no etcd read of its own.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from holdfast.common import reloading, tls
from holdfast.common.identifiers import agent_server_name
from holdfast.common.retry import retrying
from holdfast.common.tls import Role
from holdfast.coordinator import metrics
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import agent_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb

CALL_TIMEOUT_S = 2.0
RETRY_BUDGET_S = 3.0
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def indeterminate(reason: str) -> apb.ProbeResult:
    return apb.ProbeResult(
        outcome=apb.INDETERMINATE, reason=reason, observed_at_unix_ms=int(time.time() * 1000)
    )


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in RETRYABLE


class Router:
    def __init__(self, tls_dir: Path | None = None) -> None:
        self.tls_dir = tls_dir
        # One long-lived channel per host and address, and its stub (a stub per call cost 66 µs).
        self._channels: dict[tuple[str, str], tuple[grpc.aio.Channel, agent_pb2_grpc.HostAgentStub]] = {}
        # A channel keeps the certificate it was opened with, and reconnects with it: when the
        # coordinator's own files change (a renewal), later calls get new channels and the old ones
        # close once their calls are done, so an expired certificate is never presented to an agent.
        self._files = reloading.role_files(tls_dir, Role("coordinator")) if tls_dir else []
        self._stamp = reloading.files_stamp(self._files)
        self._retiring: set[asyncio.Task[None]] = set()

    def _retire_if_renewed(self) -> None:
        stamp = reloading.files_stamp(self._files)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        for channel, _ in self._channels.values():
            task = asyncio.create_task(channel.close(grace=RETRY_BUDGET_S))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        self._channels.clear()

    def agent(self, reg: pb.HostRegistration | None) -> agent_pb2_grpc.HostAgentStub | None:
        """A stub for the agent `reg` registered (one long-lived channel per host and address)."""
        if reg is None:
            return None
        self._retire_if_renewed()
        opened = self._channels.get((reg.address, reg.host_id))
        if opened is None:
            # With TLS the agent at the registered address must hold host_id's own certificate, the
            # one name in the agents' namespace no other certificate may carry: a registration
            # pointing at another host's agent, or at any other holder of a CA certificate (a
            # coordinator serving on the host's name), gets no answer, hence indeterminate.
            channel = tls.open_channel(reg.address, self.tls_dir, Role("coordinator"),
                                       server_name=agent_server_name(reg.host_id))
            opened = (channel, agent_pb2_grpc.HostAgentStub(channel))
            self._channels[(reg.address, reg.host_id)] = opened
        return opened[1]

    async def _call(self, method, request, timeout: float = CALL_TIMEOUT_S):  # type: ignore[no-untyped-def]
        return await retrying(lambda: method(request, timeout=timeout), _retryable,
                              budget_s=RETRY_BUDGET_S, attempts=4, max_wait_s=0.5)

    async def probe(self, owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                    check_tree: bool = True) -> apb.ProbeResult:
        started = time.monotonic()
        result = await self._probe(owner, reg, check_tree)
        metrics.observe_probe(owner.host_id, result, time.monotonic() - started)
        return result

    async def _probe(self, owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                     check_tree: bool) -> apb.ProbeResult:
        stub = self.agent(reg)
        if stub is None:
            return indeterminate(f"host {owner.host_id} has no live registration")
        try:
            request = apb.ProbeOwnersRequest(owners=[owner], check_tree=check_tree)
            resp = await self._call(stub.ProbeOwners, request)
        except grpc.aio.AioRpcError as exc:
            return indeterminate(f"agent of {owner.host_id} unreachable: {exc.code().name} {exc.details()}")
        if len(resp.results) != 1:
            return indeterminate(f"agent of {owner.host_id} answered {len(resp.results)} results, not one")
        return resp.results[0]

    async def kill(self, owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                   wait_seconds: float) -> apb.ProbeResult:
        started = time.monotonic()
        result = await self._kill(owner, reg, wait_seconds)
        metrics.observe_probe(owner.host_id, result, time.monotonic() - started)
        return result

    async def _kill(self, owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                    wait_seconds: float) -> apb.ProbeResult:
        stub = self.agent(reg)
        if stub is None:
            return indeterminate(f"host {owner.host_id} has no live registration")
        try:
            resp = await stub.KillOwner(
                apb.KillOwnerRequest(owner=owner, wait_seconds=wait_seconds),
                timeout=wait_seconds + CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            return indeterminate(f"agent of {owner.host_id} did not kill: {exc.code().name} {exc.details()}")
        return resp.result

    async def wait_exit(self, owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                        seconds: float) -> apb.ProbeResult | None:
        """The owner's first exit event from its agent, its tree checked there; None when `seconds`
        pass first or no agent answers. The caller re-reads and re-adjudicates: the event's result is
        a probe of the owner as of the exit, never a grant by itself."""
        stub = self.agent(reg)
        if stub is None:
            return None
        call = stub.WatchExits(apb.WatchExitsRequest(owners=[owner], check_tree=True), timeout=seconds)
        try:
            async for event in call:
                if not event.armed:
                    return event.result
        except grpc.aio.AioRpcError:
            return None  # deadline or agent gone: the re-adjudication decides, never this
        finally:
            call.cancel()
        return None

    async def reservation_unused(self, lease: pb.Lease, reg: pb.HostRegistration | None) -> apb.ProbeResult:
        """RESERVATION_UNUSED when the reserved host's agent, reading the very variable the
        reservation's token was given under, finds no process carrying it in a complete scan;
        INDETERMINATE, naming why, otherwise (a carrier is a gate about to commit)."""
        host = lease.reserved_host_id
        stub = self.agent(reg)
        if stub is None or reg is None:
            return indeterminate(f"host {host} has no live registration")
        if reg.spawn_token_env != lease.spawn_token_env:
            return indeterminate(f"the agent of {host} reads {reg.spawn_token_env}; the reserved token is "
                                 f"under {lease.spawn_token_env}")
        try:
            found = await self._call(stub.ScanSpawnToken,
                                     apb.ScanSpawnTokenRequest(spawn_token=lease.reserved_spawn_token))
        except grpc.aio.AioRpcError as exc:
            return indeterminate(f"agent of {host} unreachable: {exc.code().name} {exc.details()}")
        # A gate is a child of its `run`, never the namespace's init: an unreadable init (as inside
        # many containers) cannot hide one.
        hidden = found.unreadable - found.init_unreadable
        if not found.enumerable or not found.stable or hidden:
            return indeterminate(f"the scan of {host} is incomplete ({hidden} unreadable, "
                                 f"stable {found.stable})")
        result = indeterminate(f"pid {found.carriers[0].pid} on {host} carries the reserved token"
                               if found.carriers else
                               f"no process of {found.scanned} on {host} carries the reserved token")
        result.answered_by_host_id = host
        if not found.carriers:
            result.outcome = apb.RESERVATION_UNUSED
        return result

    async def attest(self, host_id: str, reg: pb.HostRegistration | None, token: str, pid_hint: int,
                     session_id: str, fence: int) -> apb.ProcessIdentity | str:
        """The attested identity (the agent moved the root into a session cgroup named for this
        session and fence), or why there is none."""
        stub = self.agent(reg)
        if stub is None:
            return f"host {host_id} has no live registration"
        try:
            request = apb.AttestSpawnRequest(spawn_token=token, pid_hint=pid_hint, session_id=session_id,
                                             fence=fence)
            resp = await self._call(stub.AttestSpawn, request)
        except grpc.aio.AioRpcError as exc:
            return f"agent of {host_id}: {exc.code().name} {exc.details()}"
        return resp.identity

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close()
