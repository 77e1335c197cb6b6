"""The coordinator's Prometheus metrics, recorded at the edges (RPC handlers, routing, a census task),
never inside the pure adjudication rules.

`holdfast_session_indeterminate_seconds{session}` is how long this replica has been answering
OWNERSHIP_UNKNOWN for a session it was asked about (Acquire, ProbeSession), cleared by any other
verdict; `holdfast_sessions` and `holdfast_host_registered` come from a periodic census of etcd, so
every replica reports the same figures (aggregate with max). Labels never carry tokens or secrets.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from holdfast.coordinator import keys
from holdfast.coordinator.registry import Registry
from holdfast.coordinator.store import Entry, Store, StoreUnavailable
from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb

log = logging.getLogger(__name__)
CENSUS_PAGE = 500

PROBES = Counter("holdfast_probes", "Probes routed to an owner host's agent, by host and outcome",
                 ["host", "outcome"])
PROBE_SECONDS = Histogram("holdfast_probe_seconds", "Routed probe latency including retries", ["host"])
GRANTS = Counter("holdfast_grants", "Acquire grants, by why the grant was allowed", ["reason"])
TAKEOVER_SECONDS = Histogram("holdfast_takeover_seconds", "Acquire calls that took a session over (a "
                             "takeover, or its owner proven dead): seconds from the call to the grant, "
                             "by why it was allowed", ["reason"],
                             buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
REFUSALS = Counter("holdfast_refusals", "Refused calls, by RPC and reason (a refusal writes nothing)",
                   ["rpc", "reason"])
ETCD_ERRORS = Counter("holdfast_etcd_errors", "Calls that found etcd unavailable", ["rpc"])
SESSIONS = Gauge("holdfast_sessions", "Session records by claim status and handoff stage (census)",
                 ["claim_status", "handoff_stage"])
HOST_REGISTERED = Gauge("holdfast_host_registered", "1 while a host has a live agent registration (census)",
                        ["host"])


def observe_probe(host: str, result: agent_pb2.ProbeResult, seconds: float) -> None:
    PROBES.labels(host, agent_pb2.ProbeOutcome.Name(result.outcome).lower()).inc()
    PROBE_SECONDS.labels(host).observe(seconds)


class IndeterminateSince(Collector):
    """Per session: monotonic time of the first OWNERSHIP_UNKNOWN answer in an unbroken run of them."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()  # the scrape runs on prometheus_client's thread

    def verdict(self, session: str, reason: str) -> None:
        with self._lock:
            if reason == "OWNERSHIP_UNKNOWN":
                self._since.setdefault(session, time.monotonic())
            else:
                self._since.pop(session, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("holdfast_session_indeterminate_seconds",
                                   "Seconds a session has answered OWNERSHIP_UNKNOWN without a break",
                                   labels=["session"])
        now = time.monotonic()
        with self._lock:
            for session, since in self._since.items():
                family.add_metric([session], now - since)
        yield family


INDETERMINATE = IndeterminateSince()
REGISTRY.register(INDETERMINATE)


def count_sessions(found: Iterable[pb.SessionRecord]) -> collections.Counter[tuple[str, str]]:
    return collections.Counter((pb.ClaimStatus.Name(r.lease.claim_status).lower(),
                                pb.HandoffStage.Name(r.lease.handoff_stage).lower()) for r in found)


async def census(store: Store, registry: Registry, seen_hosts: set[str],
                 decode: Callable[[Entry], pb.SessionRecord]) -> None:
    """One pass: count every session record (paged; `decode` is the sessions' cached decoding: at
    100k records, parsing every record's JSON each pass cost seconds of the event loop) and mark
    every registered host."""
    prefix = keys.sessions_prefix(store)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    after = ""
    while True:
        entries, more = await store.list_prefix(prefix, after, CENSUS_PAGE)
        counts += count_sessions(decode(e) for e in entries)
        if not more or not entries:
            break
        after = entries[-1].key
    SESSIONS.clear()
    for (status, stage), n in counts.items():
        SESSIONS.labels(status, stage).set(n)
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
