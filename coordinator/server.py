"""The coordinator's grpc.aio server: the Coordinator service plus health and reflection.

Guarantee: it keeps no state of its own (everything is in etcd), so a restart or a second replica
changes nothing a client can observe; it reports its real address only after binding.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import DEFAULT_PREFIX, Store
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
DRAIN_SECONDS = 2.0


async def serve(etcd: str, listen: str, ready_file: str | None = None, prefix: str = DEFAULT_PREFIX) -> None:
    log = logging.getLogger("holdfast.coordinator")
    store = Store.connect(etcd, prefix=prefix)
    service = CoordinatorService(store)
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(service, server)
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
    log.info("coordinator serving on %s over etcd %s", address, etcd)
    if ready_file:
        tmp = Path(ready_file + ".tmp")
        tmp.write_text(json.dumps({"address": address}))
        tmp.rename(ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await health_servicer.enter_graceful_shutdown()
    await server.stop(DRAIN_SECONDS)
    await service.router.close()
    await store.close()
