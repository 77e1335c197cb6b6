"""The periodic census of etcd behind `holdfast_sessions`, `holdfast_host_registered` and the carry
budgets' use, `holdfast_carry_reserved_bytes` and `holdfast_carry_tenant_reserved_bytes{tenant}`
(coordinator/metrics.py defines them).

Guarantee: every replica counts the same records, so every replica reports the same figures
(aggregate with max); a pass that finds etcd unavailable is skipped and counted, never half-applied
to the gauges. It reads, and never writes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable

from holdfast.coordinator import carry, keys
from holdfast.coordinator.metrics import (
    CARRY_RESERVED,
    CARRY_TENANT_RESERVED,
    ETCD_ERRORS,
    HOST_REGISTERED,
    SESSIONS,
)
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.store import Entry, Store, StoreUnavailable
from holdfast.v1 import coordinator_pb2 as pb

log = logging.getLogger(__name__)
CENSUS_PAGE = 500


def count_sessions(found: Iterable[pb.SessionRecord]) -> collections.Counter[tuple[str, str]]:
    return collections.Counter((pb.ClaimStatus.Name(r.lease.claim_status).lower(),
                                pb.HandoffStage.Name(r.lease.handoff_stage).lower()) for r in found)


async def census(store: Store, registry: Registry, seen_hosts: set[str],
                 decode: Callable[[Entry], pb.SessionRecord]) -> None:
    """One pass: count every session record (paged; `decode` is the sessions' cached decoding: at
    100k records, parsing every record's JSON each pass cost seconds of the event loop), read the
    carry budgets' use and mark every registered host."""
    prefix = keys.sessions_prefix(store)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    after = ""
    while True:
        entries, more = await store.list_prefix(prefix, after, CENSUS_PAGE)
        counts += count_sessions(decode(e) for e in entries)
        if not more or not entries:
            break
        after = entries[-1].key
    cluster_bytes, tenant_bytes = await carry.reserved(store)
    SESSIONS.clear()
    for (status, stage), n in counts.items():
        SESSIONS.labels(status, stage).set(n)
    CARRY_RESERVED.set(cluster_bytes)
    CARRY_TENANT_RESERVED.clear()
    for tenant, n in tenant_bytes.items():
        CARRY_TENANT_RESERVED.labels(tenant).set(n)
    live = {h.host_id for h in await registry.list()}
    for host in seen_hosts | live:
        HOST_REGISTERED.labels(host).set(1 if host in live else 0)  # a vanished host shows 0, not nothing
    seen_hosts |= live


async def census_loop(store: Store, registry: Registry, interval: float,
                      decode: Callable[[Entry], pb.SessionRecord]) -> None:
    seen: set[str] = set()
    while True:
        try:
            await census(store, registry, seen, decode)
        except StoreUnavailable as exc:
            ETCD_ERRORS.labels("census").inc()
            log.warning("census skipped: %s", exc)
        await asyncio.sleep(interval)
