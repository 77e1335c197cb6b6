"""The coordinator's grpc.aio server: the Coordinator service plus health and reflection.

Guarantee: it keeps no state of its own (everything is in etcd), so a restart or a second replica
changes nothing a client can observe; it reports its real address only after binding. With TLS its
own certificate and CA bundle follow their files (holdfast.common.reloading): a renewed or replaced
certificate is served from the next handshake, without a restart. With an issuer it also serves
holdfast.v1.Enrollment on its own server-auth-only listener (holdfast.enrollment.issuer).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from pathlib import Path

from holdfast.common import serving as serving_
from holdfast.common.authorization import RoleGate
from holdfast.common.reloading import ReloadingCredentials
from holdfast.common.tls import ETCD_SUBDIR, Role
from holdfast.coordinator import metrics
from holdfast.coordinator.authorization import coordinator_rule
from holdfast.coordinator.call_limits import DEFAULT_CALL_LIMITS, CallLimits, streams_per_connection
from holdfast.coordinator.carry_budget_rules import DEFAULT_LIMITS, CarryLimits
from holdfast.coordinator.census import census_loop
from holdfast.coordinator.host_fencing import FencingSettings
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import DEFAULT_PREFIX, Store, StoreUnavailable, etcd_credentials
from holdfast.coordinator.tenancy import DEFAULT_TENANT
from holdfast.coordinator.watch_hub import UNREAD_BUDGET_BYTES
from holdfast.enrollment import issuer as issuer_
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
DRAIN_SECONDS = 2.0


async def _learn_cluster(service: CoordinatorService, log: logging.Logger) -> None:
    """Reads (or, first in a new keyspace, creates) the cluster identity at start-up and logs it, so
    an operator can tell two clusters apart; with etcd away, the first grant makes or reads it."""
    try:
        cluster = await service.cluster.ensure()
    except StoreUnavailable as exc:
        log.warning("cluster identity not read yet", extra={"fields": {"error": str(exc)}})
        return
    log.info("cluster identity", extra={"fields": {"cluster_id": cluster}})


async def serve(etcd: str, listen: str, ready_file: str | None = None, prefix: str = DEFAULT_PREFIX,
                tls_dir: Path | None = None, etcd_tls_dir: Path | None = None, metrics_listen: str = "",
                census_seconds: float = 15.0, health_listen: str = "",
                commit_window_seconds: float = 30.0,
                issuer: tuple[str, issuer_.Issuer] | None = None,
                carry_limits: CarryLimits = DEFAULT_LIMITS,
                fencing: FencingSettings | None = None, default_tenant: str = DEFAULT_TENANT,
                call_limits: CallLimits = DEFAULT_CALL_LIMITS,
                watch_unread_budget: int = UNREAD_BUDGET_BYTES) -> None:
    """With `tls_dir`: mTLS only, roles checked before any handler, agents dialled with the
    coordinator certificate; etcd with `etcd_tls_dir` (default `<tls_dir>/etcd`)."""
    log = logging.getLogger("holdfast.coordinator")
    if tls_dir is not None and etcd_tls_dir is None:
        etcd_tls_dir = tls_dir / ETCD_SUBDIR
    store = Store.connect(etcd, etcd_credentials(etcd, etcd_tls_dir), prefix=prefix,
                          unread_budget=watch_unread_budget)
    metrics.WATCH_UNREAD.set_function(lambda: store.watch_budget.unread)
    # Which replica ran a fence is part of its evidence: this machine, this process, what it serves.
    name = f"{socket.gethostname()} pid {os.getpid()} listening on {listen}"
    service = CoordinatorService(store, tls_dir, commit_window_ms=int(commit_window_seconds * 1000),
                                 carry_limits=carry_limits, fencing=fencing, name=name,
                                 default_tenant=default_tenant, call_limits=call_limits)
    add_service = functools.partial(coordinator_pb2_grpc.add_CoordinatorServicer_to_server, service)
    credentials, gates = None, []
    if tls_dir is not None:
        credentials = ReloadingCredentials(tls_dir, Role("coordinator")).server_credentials()
        gates = [RoleGate(SERVICE_NAME, coordinator_rule)]
    streams = [("grpc.max_concurrent_streams", streams_per_connection(call_limits))]
    serving = await serving_.start(listen, SERVICE_NAME, add_service, credentials, gates, health_listen,
                                   streams)
    enroll_serving = None
    if issuer is not None and tls_dir is not None:
        enroll_serving = await issuer_.start(issuer[0], tls_dir, issuer[1])
    metrics_address = serving_.start_metrics(metrics_listen)
    census = asyncio.create_task(census_loop(store, service.registry, census_seconds,
                                                     service.sessions.decode)) if metrics_address else None
    following = asyncio.create_task(service.registry.follow())
    fencing_loop = asyncio.create_task(service.host_fencing.run())
    log.info("coordinator serving", extra={"fields": {"address": serving.address, "etcd": etcd,
                                                      "prefix": prefix, "health": serving.health_address,
                                                      "tls": tls_dir is not None,
                                                      "enroll": enroll_serving.address if enroll_serving
                                                      else "",
                                                      "metrics": metrics_address}})
    # Before the ready file: the identity exists once the coordinator says it serves, so no call's
    # before-and-after comparison of the keyspace ever sees it appear.
    await _learn_cluster(service, log)
    serving_.announce(ready_file, serving, metrics_address,
                      enroll_serving.address if enroll_serving is not None else "")
    await serving_.until_stop_signal()
    following.cancel()
    fencing_loop.cancel()
    if census is not None:
        census.cancel()
    await serving_.drain(serving, DRAIN_SECONDS)
    if enroll_serving is not None:
        await serving_.drain(enroll_serving, 0)
    await service.router.close()
    await store.close()
