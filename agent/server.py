"""The agent's server lifecycle: bind, serve HostAgent + health + reflection (and /metrics when asked),
and on SIGTERM/SIGINT stop taking calls, drain in-flight ones, and exit cleanly.

With TLS the server's certificate follows its files (holdfast.common.reloading): a renewed or
replaced pair is served from the next handshake on, without a restart; with an enroller, this
process renews it itself (holdfast.agent.rotation).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
from pathlib import Path

from holdfast.agent import hostinfo, rotation
from holdfast.agent.authorization import agent_rule
from holdfast.agent.service import HostAgentService
from holdfast.common import serving as serving_
from holdfast.common import tls
from holdfast.common.authorization import RoleGate
from holdfast.common.reloading import ReloadingCredentials
from holdfast.proc import listing_rules
from holdfast.proc.scan import listing_hidden
from holdfast.v1 import agent_pb2, agent_pb2_grpc

DRAIN_SECONDS = 5.0
SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["HostAgent"].full_name


def raise_open_file_limit() -> None:
    """The soft open-file limit up to the hard one: a pidfd per known process (proc/ages.py) and
    one per watched owner are this agent's, as many as the node runs processes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(listen: str, host_id: str, spawn_token_env: str, ready_file: str | None = None,
                tls_dir: Path | None = None, metrics_listen: str = "", health_listen: str = "",
                enroller: rotation.Enroller | None = None, bound: asyncio.Future[str] | None = None) -> None:
    """Serves until SIGTERM or SIGINT; the address bound is written to `ready_file` and set as the
    result of `bound` (what registration registers), when given, once the server takes calls."""
    log = logging.getLogger("holdfast.agent")
    raise_open_file_limit()  # before the service sizes its pidfd budget from it
    service = HostAgentService(host_id, hostinfo.gather(), spawn_token_env)
    add_service = functools.partial(agent_pb2_grpc.add_HostAgentServicer_to_server, service)
    credentials, gates, reloading = None, [], None
    if tls_dir is not None:
        reloading = ReloadingCredentials(tls_dir, tls.Role("agent", host_id))
        credentials = reloading.server_credentials()
        gates = [RoleGate(SERVICE_NAME, agent_rule)]
    serving = await serving_.start(listen, SERVICE_NAME, add_service, credentials, gates, health_listen)
    metrics = serving_.start_metrics(metrics_listen)
    log.info("agent serving", extra={"fields": {"address": serving.address, "host": host_id,
                                                "metrics": metrics, "health": serving.health_address,
                                                "pid_ns": service.facts.incarnation.pid_ns,
                                                "tls": tls_dir is not None,
                                                "session_cgroups": service.cgroups.reason or "yes"}})
    if hidden := listing_hidden("/proc"):
        # Every scan reads as incomplete (each is checked afresh): said once here, with the fix.
        log.warning("scans cannot prove a tree gone: /proc hides processes from this agent",
                    extra={"fields": {"why": hidden, "fix": listing_rules.FIX}})
    serving_.announce(ready_file, serving, metrics)
    if bound is not None:
        bound.set_result(serving.address)
    tasks = [asyncio.create_task(service.sweep_cgroups())]
    if enroller is not None and reloading is not None:
        tasks.append(asyncio.create_task(rotation.renew_forever(enroller, reloading)))
    try:
        await serving_.until_stop_signal()
    finally:
        for task in tasks:
            task.cancel()
    log.info("draining", extra={"fields": {"grace_s": DRAIN_SECONDS}})
    await serving_.drain(serving, DRAIN_SECONDS)
    log.info("stopped")
