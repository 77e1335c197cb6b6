"""The agent's server lifecycle: bind, serve HostAgent + health + reflection, log JSON lines, and
on SIGTERM/SIGINT stop taking calls, drain in-flight ones, and exit cleanly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from holdfast.agent import hostinfo
from holdfast.agent.service import HostAgentService
from holdfast.v1 import agent_pb2, agent_pb2_grpc

DRAIN_SECONDS = 5.0
SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["HostAgent"].full_name


class JsonFormatter(logging.Formatter):
    """One JSON object per line; callers pass only vetted `fields` (never tokens or environ)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(time.time(), 3), "level": record.levelname.lower(), "msg": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        return json.dumps(entry)


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("holdfast")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


async def serve(listen: str, host_id: str, spawn_token_env: str, ready_file: str | None = None) -> None:
    log = logging.getLogger("holdfast.agent")
    service = HostAgentService(host_id, hostinfo.gather(), spawn_token_env)
    server = grpc.aio.server()
    agent_pb2_grpc.add_HostAgentServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")
    address = f"{listen.rsplit(':', 1)[0]}:{port}"
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("agent serving", extra={"fields": {"address": address, "host_id": host_id,
                                                "pid_ns": service.facts.incarnation.pid_ns}})
    if ready_file:
        # Written after bind so a supervisor learns the real port when it asked for port 0.
        tmp = Path(ready_file + ".tmp")
        tmp.write_text(json.dumps({"address": address}))
        tmp.rename(ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining", extra={"fields": {"grace_s": DRAIN_SECONDS}})
    await health_servicer.enter_graceful_shutdown()
    await server.stop(DRAIN_SECONDS)
    log.info("stopped")
