"""Cost of the operating instrumentation, as ratios to work the same call already does, in one process.

Agent: the metrics one ProbeOwners records (probe counter + latency + scan histogram/gauge) against
one /proc scan (every ProbeOwners with check_tree does one). Coordinator: what one transition adds
(probe counter + histogram, grant counter, indeterminate clock, one JSON log line formatted) against
encoding the record it writes (records.encode, done on every transition). Prints; asserts nothing.
Run: .venv/bin/python bench/bench_metrics.py
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

from holdfast.agent import metrics as agent_metrics
from holdfast.common import logs
from holdfast.coordinator import metrics, records
from holdfast.proc.scan import scan
from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb

ROUNDS = 7


def per_call(fn: Callable[[], object], n: int) -> float:
    """Median over ROUNDS of the mean seconds per call."""
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def main() -> None:
    result = agent_pb2.ProbeResult(outcome=agent_pb2.IDENTITY_MATCHED)
    found = scan(b"HOLDFAST_SPAWN_TOKEN")

    def agent_side() -> None:
        agent_metrics.observe_probes("host-a", [result], 0.001)
        agent_metrics.observe_scan(found, 0.005)

    scan_s = per_call(lambda: scan(b"HOLDFAST_SPAWN_TOKEN"), 20)
    agent_s = per_call(agent_side, 20_000)
    print(f"agent: instrumentation {agent_s * 1e6:.1f} us per ProbeOwners, one scan of {found.scanned} "
          f"processes {scan_s * 1e3:.2f} ms, ratio {agent_s / scan_s:.4f}")

    record = records.new_record("sess-bench-0001", "p", "l")
    record.lease.fence = 7
    record.lease.claim_status = pb.LIVE
    formatter = logs.JsonFormatter()
    entry = logging.LogRecord("holdfast.coordinator.sessions", logging.INFO, __file__, 1, "session %s",
                              ("grant",), None)
    entry.fields = logs.session_fields("sess-bench-0001", 7, "host-a", transition="grant", applied=True)

    def coordinator_side() -> None:
        metrics.observe_probe("host-a", result, 0.002)
        metrics.GRANTS.labels("OWNER_DEAD").inc()
        metrics.INDETERMINATE.verdict("sess-bench-0001", "OWNER_DEAD")
        formatter.format(entry)

    encode_s = per_call(lambda: records.encode(record), 5_000)
    coord_s = per_call(coordinator_side, 20_000)
    print(f"coordinator: instrumentation {coord_s * 1e6:.1f} us per transition, records.encode "
          f"{encode_s * 1e6:.1f} us, ratio {coord_s / encode_s:.2f}")


if __name__ == "__main__":
    main()
