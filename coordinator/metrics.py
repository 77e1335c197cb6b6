"""The coordinator's Prometheus metrics, defined once and recorded at the edges (RPC handlers,
routing, the census task in coordinator/census.py), never inside the pure adjudication rules.

`holdfast_session_indeterminate_seconds{session}` is how long this replica has been answering
OWNERSHIP_UNKNOWN for a session it was asked about (Acquire, ProbeSession), cleared by any other
verdict; `holdfast_sessions`, `holdfast_host_registered` and the carry budgets' use come from a
periodic census of etcd, so every replica reports the same figures (aggregate with max). Labels
never carry tokens or secrets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from holdfast.common.reasons import Reason
from holdfast.v1 import agent_pb2

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
TENANT_REFUSALS = Counter("holdfast_tenant_refusals", "Calls refused because the session is another "
                          "tenant's (WRONG_TENANT), by RPC; each is logged with both identities", ["rpc"])
ETCD_ERRORS = Counter("holdfast_etcd_errors", "Calls that found etcd unavailable", ["rpc"])
SESSIONS = Gauge("holdfast_sessions", "Session records by claim status and handoff stage (census)",
                 ["claim_status", "handoff_stage"])
FENCE_ATTEMPTS = Counter("holdfast_fence_attempts", "Fence agent attempts on lost hosts by this replica, "
                         "by host and answer (off is the only proof; on and unknown freed nothing)",
                         ["host", "answer"])
HOST_ABSENT_SECONDS = Gauge("holdfast_host_absent_seconds", "Seconds this replica has seen a host that "
                            "sessions name without a registration (fenced after host_loss_after)", ["host"])
ACQUIRES_WAITING = Gauge("holdfast_acquires_waiting", "Acquire calls this replica holds open for a held or "
                         "reserved session (run --wait, a takeover waiting for the owner's exit)")
STREAMS_OPEN = Gauge("holdfast_streams_open", "Streaming calls this replica serves now, by RPC: Hold is each "
                     "owner watching its record on its grant's call (and each run waiting for its grant), "
                     "WatchSessions every other watch", ["rpc"])
WATCH_UNREAD = Gauge("holdfast_watch_unread_bytes", "Watch events this replica holds for readers that have "
                     "not taken them, all watches together (bounded by watch_unread_budget_bytes)")
CARRY_RESERVED = Gauge("holdfast_carry_reserved_bytes", "Carried state reserved against the cluster's "
                       "carry budget, carry_budget_bytes (census)")
CARRY_TENANT_RESERVED = Gauge("holdfast_carry_tenant_reserved_bytes", "Carried state reserved against each "
                              "tenant's carry budget, carry_tenant_budget_bytes (census)", ["tenant"])
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
            if reason == Reason.OWNERSHIP_UNKNOWN:
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
