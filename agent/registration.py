"""The agent side of registration (docs/design.md §4): RegisterHost, then unary Heartbeats.

Guarantee: the agent keeps serving probes whatever happens here — a coordinator that is away only
delays renewal; a lapsed registration is registered again; a refusal (the host id held by a live
registration, or a fence of this host running or proven) is logged loudly, with the coordinator's
reason, and retried only after that lease could have expired.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc

from holdfast.agent import hostinfo, metrics
from holdfast.common import reasons, tls
from holdfast.common.reasons import Reason
from holdfast.common.version import VERSION
from holdfast.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger("holdfast.agent.registration")
TTL_SECONDS = 10
FENCING_RETRY_S = 1.0  # after HOST_FENCING: the attempt running now ends in moments
CALL_TIMEOUT_S = 3.0


async def keep_registered(
    coordinator: str,
    host_id: str,
    address: str,
    incarnation: agent_pb2.HostIncarnation,
    spawn_token_env: str,
    agent_version: str,
    ttl: int = TTL_SECONDS,
    tls_dir: Path | None = None,
) -> None:
    """Runs until cancelled."""
    registration = coordinator_pb2.HostRegistration(
        host_id=host_id,
        address=address,
        incarnation=incarnation,
        spawn_token_env=spawn_token_env,
        agent_version=agent_version,
    )
    # Only this host's own agent certificate may register it (the coordinator checks the role).
    # The channel is opened again whenever the certificate file changes (a renewal): a channel keeps
    # the credentials it was made with, and the old certificate will expire under it.
    lease_id = 0
    while True:
        opened = _cert_stamp(tls_dir, host_id)
        async with tls.open_channel(coordinator, tls_dir, tls.Role("agent", host_id)) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while _cert_stamp(tls_dir, host_id) == opened:
                lease_id, ttl = await _register_or_beat(stub, registration, host_id, coordinator, lease_id,
                                                        ttl)


def _cert_stamp(tls_dir: Path | None, host_id: str) -> tuple[int, int]:
    if tls_dir is None:
        return (0, 0)
    try:
        st = (tls.files_dir(tls_dir) / f"{tls.Role('agent', host_id).file_stem}.pem").stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)


async def _register_or_beat(stub: coordinator_pb2_grpc.CoordinatorStub,
                            registration: coordinator_pb2.HostRegistration, host_id: str, coordinator: str,
                            lease_id: int, ttl: int) -> tuple[int, int]:
    """One registration or heartbeat and the wait after it; returns the lease and ttl to go on with."""
    try:
        if lease_id == 0:
            reply = await stub.RegisterHost(
                coordinator_pb2.RegisterHostRequest(registration=registration, ttl_seconds=ttl),
                timeout=CALL_TIMEOUT_S,
            )
            lease_id, ttl = reply.lease_id, reply.ttl_seconds
            metrics.REGISTERED.labels(host_id).set(1)
            log.info("registered host %s at %s with %s", host_id, coordinator, registration.address)
        else:
            await stub.Heartbeat(
                coordinator_pb2.HeartbeatRequest(host_id=host_id, lease_id=lease_id),
                timeout=CALL_TIMEOUT_S,
            )
        await asyncio.sleep(max(ttl / 3, 0.5))
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            metrics.REGISTERED.labels(host_id).set(0)  # known lapsed or refused; a blip says nothing
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return 0, ttl  # our registration lapsed: register again at once
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
            # The details say which: a live registration holds the id, a fence of this host is
            # running, or this very incarnation was fenced (then this machine must be stopped).
            log.error("host id %s not registered: %s", host_id, exc.details())
            # A fence that proves nothing ends in moments and is retried with a growing backoff:
            # asked again soon, the agent registers in the gap instead of meeting the next attempt.
            await asyncio.sleep(FENCING_RETRY_S if reasons.reason_of(exc) == Reason.HOST_FENCING else ttl)
            return lease_id, ttl
        if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            # A certificate problem does not fix itself by hammering: say so, retry slowly.
            log.error("coordinator %s refused host %s's certificate: %s", coordinator, host_id,
                      exc.details())
            await asyncio.sleep(ttl)
            return lease_id, ttl
        log.warning(
            "coordinator %s unreachable (%s); still serving probes", coordinator, exc.code().name
        )
        await asyncio.sleep(1.0)
    return lease_id, ttl

async def serve_registered(
    serve: Callable[[asyncio.Future[str]], Coroutine[object, object, None]],
    coordinator: str,
    host_id: str,
    spawn_token_env: str,
    tls_dir: Path | None = None,
    advertise: str = "",
    ttl: int = TTL_SECONDS,
) -> None:
    """Runs the agent server and, once it has bound, keeps it registered until the server stops.

    The registered address is `advertise` when set, else the one the server bound, handed over by
    `serve` in this process (it sets the future it is given): never read back from its ready file,
    where a file already there — the previous run's, or one another user put in a shared
    directory — was registered before the server had written its own. Coordinators dial exactly
    what is registered; with TLS they still accept only this host's certificate behind it."""
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(bound))
    either: list[asyncio.Future[Any]] = [server, bound]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not bound.done():  # the server ended before it bound: its error, if any, is the caller's
        bound.cancel()
        await server
        return
    address = advertise or bound.result()
    keeper = asyncio.create_task(
        keep_registered(
            coordinator, host_id, address, hostinfo.current_incarnation(), spawn_token_env, VERSION,
            ttl=ttl, tls_dir=tls_dir,
        )
    )
    try:
        await server
    finally:
        keeper.cancel()
