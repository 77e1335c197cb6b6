"""The agent's Prometheus metrics; recorded at the RPC edges (service.py, registration.py), never inside
the probe rules. Labels carry host ids and outcomes only — never tokens, pids or environ.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

from holdfast.proc.scan import Scan
from holdfast.v1 import agent_pb2

PROBES = Counter("holdfast_agent_probes", "Owner probes answered, by outcome", ["host", "outcome"])
PROBE_SECONDS = Histogram("holdfast_agent_probe_seconds", "ProbeOwners latency (one batch)", ["host"])
SCAN_SECONDS = Histogram("holdfast_agent_scan_seconds", "Duration of one /proc environ scan")
SCANS = Counter("holdfast_agent_scans", "Scans of /proc, by whether every process was readable", ["complete"])
SCAN_UNREADABLE = Gauge("holdfast_agent_scan_unreadable_processes",
                        "Processes whose environ the last scan could not read (absence claims are off)")
SCAN_PASSES = Histogram("holdfast_agent_scan_passes", "Passes over /proc one stable scan took",
                        buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256))
READS_PARKED = Gauge("holdfast_agent_reads_parked",
                     "Reads of another process's memory given up as stuck and still pending: a thread parked "
                     "in the kernel each, and their processes unreadable (scans meeting them incomplete)")
READS_REFUSED = Counter("holdfast_agent_reads_refused",
                        "Reads of another process's memory not started: its read was pending, or too "
                        "many were")
READS_WAITING = Gauge("holdfast_agent_reads_waiting",
                      "Jobs reading other processes' memory waiting for a reader thread (all busy)")
READS_DROPPED = Counter("holdfast_agent_reads_dropped",
                        "Jobs dropped before they ran: their caller went away (its deadline passed, or it "
                        "was cancelled) while every reader thread was busy")
ATTESTATIONS = Counter("holdfast_agent_attestations", "Trees attested, by the proof their end needs "
                       "(scan_only: no session cgroup could be made)", ["tree_proof"])
SESSION_CGROUPS_SWEPT = Counter("holdfast_agent_session_cgroups_swept", "Empty session cgroups removed")
REGISTERED = Gauge("holdfast_agent_registered", "1 while this agent holds a live registration", ["host"])


M = TypeVar("M", Counter, Gauge, Histogram)


@functools.cache
def series(metric: M, *labels: str) -> M:
    """`metric.labels(*labels)`, looked up once: a labelled series lives as long as its metric (none
    is ever removed here), where `labels` takes a lock and rebuilds its key on every call."""
    return metric.labels(*labels)


def outcome_name(outcome: int) -> str:
    return agent_pb2.ProbeOutcome.Name(outcome).lower()


def observe_attestation(identity: agent_pb2.ProcessIdentity) -> None:
    series(ATTESTATIONS, agent_pb2.TreeProof.Name(identity.tree_proof).lower()).inc()


def observe_probes(host: str, results: Iterable[agent_pb2.ProbeResult], seconds: float) -> None:
    series(PROBE_SECONDS, host).observe(seconds)
    for result in results:
        series(PROBES, host, outcome_name(result.outcome)).inc()


def observe_scan(result: Scan, seconds: float) -> None:
    SCAN_SECONDS.observe(seconds)
    SCAN_PASSES.observe(result.passes)
    series(SCANS, str(result.complete).lower()).inc()
    SCAN_UNREADABLE.set(result.unreadable)
