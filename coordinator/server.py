"""The coordinator's grpc.aio server: the Coordinator service plus health and reflection.

Guarantee: it keeps no state of its own (everything is in etcd), so a restart or a second replica
changes nothing a client can observe; it reports its real address only after binding.
"""

from __future__ import annotations

import functools
import logging

from holdfast.agent import serving as serving_
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import DEFAULT_PREFIX, Store
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
DRAIN_SECONDS = 2.0


async def serve(etcd: str, listen: str, ready_file: str | None = None, prefix: str = DEFAULT_PREFIX) -> None:
    log = logging.getLogger("holdfast.coordinator")
    store = Store.connect(etcd, prefix=prefix)
    service = CoordinatorService(store)
    add_service = functools.partial(coordinator_pb2_grpc.add_CoordinatorServicer_to_server, service)
    serving = await serving_.start(listen, SERVICE_NAME, add_service)
    address = serving.address
    log.info("coordinator serving on %s over etcd %s", address, etcd)
    serving_.announce(ready_file, address)
    await serving_.until_stop_signal()
    await serving_.drain(serving, DRAIN_SECONDS)
    await service.router.close()
    await store.close()
