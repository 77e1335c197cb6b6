"""Every headline figure of docs/benchmarks.md in one run, each held against a floor measured in the
same run on the same machine (absolute times on a shared machine move; the ratio to the floor
measured beside it does not). Prints one table, or `--json`; asserts nothing, never fails on a
missed goal. Run: bench/all [--runs N] [--json] [--quick]

With the scale figures (skipped by --quick), each scale bench runs in its own process with its own
stack: bench_scale.py (100,000 records), bench_takeover_load.py (1,000 owners), bench_hosts.py (50
simulated hosts), and each figure is held against the same measure at small scale.

CPU per operation (bench_cpu.py, its own stack; 1,000 cycles, --quick too): each server in a
cgroup of its own, `cpu.stat` usage_usec around each span, its idle rate subtracted; held against
absolute goals, since CPU time does not depend on the machine's cores or its other load.

Floors (docs/benchmarks.md, *Floors*): an etcd write (one put, fsync on, data on disk), a gRPC unary
(grpc.health.v1 Check on an agent), a fork/exec of `sh -c true`, an interpreter that imports grpc
(started on a simulated host, as the measured `run` is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coordinator import cycles, direct_cas, probe_latency
from bench_coordinator_list import populate
from bench_handoff import Bench, pct

from holdfast.coordinator.store import DEFAULT_PREFIX, Put, Store
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

LIST_RECORDS = 10_000
PAGE = 500
SCALE_RECORDS = 100_000
RSS_GOAL_MB = 200
BENCH = Path(__file__).resolve().parent
MET = {True: "yes", False: "**no**", None: "-"}


@dataclass
class Figure:
    figure: str
    value: float
    unit: str
    floor_name: str
    floor: float
    goal_ratio: float | None  # None: measured and shown, with no goal set for it
    higher_is_better: bool = False

    @property
    def ratio(self) -> float:
        return self.value / self.floor if self.floor else float("inf")

    @property
    def goal(self) -> str:
        if self.goal_ratio is None:
            return "-"
        return f"{'>=' if self.higher_is_better else '<='} {self.goal_ratio:g}x"

    @property
    def met(self) -> bool | None:
        if self.goal_ratio is None:
            return None
        return self.ratio >= self.goal_ratio if self.higher_is_better else self.ratio <= self.goal_ratio


def cpu_pressure_avg60() -> float | None:
    """The share of the last minute some task waited for a CPU (`/proc/pressure/cpu`, `some
    avg60`, percent), read before the run: on a shared machine the figures move with it, so a
    run's table says what the machine was doing (None: no PSI here)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = next(line for line in f if line.startswith("some "))
    except (OSError, StopIteration):
        return None
    fields = dict(part.split("=", 1) for part in some.split()[1:])
    return float(fields["avg60"])


def progress(message: str) -> None:
    print(f"[bench/all {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(action: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        action()
        samples.append(time.perf_counter() - t)
    return samples


def import_grpc(host: SimulatedHost) -> Callable[[], object]:
    """An interpreter that imports grpc, started the way the measured `run` is started: through
    nsenter into a simulated host. That launch (~3 ms) is the simulation's, not holdfast's, so it
    stands on both sides of the ratio."""
    def once() -> None:
        if host.spawn([sys.executable, "-c", "import grpc"]).wait() != 0:
            raise RuntimeError("the interpreter floor's `import grpc` failed")
    return once


async def etcd_write_samples(url: str, n: int) -> list[float]:
    store = Store.connect(url, prefix="/bench-floor/")
    samples = []
    for i in range(n):
        t = time.perf_counter()
        await store.txn([], [Put(store.key("w"), str(i).encode())])
        samples.append(time.perf_counter() - t)
    await store.close()
    return samples


async def bare_range_ms(url: str) -> float:
    """The same keys ListSessions reads, in pages of the same size, with nothing decoded."""
    store = Store.connect(url, prefix=DEFAULT_PREFIX)
    prefix, after = store.key("sessions", ""), ""
    t = time.perf_counter()
    while True:
        entries, more = await store.list_prefix(prefix, start_after=after, limit=PAGE)
        if not more:
            break
        after = entries[-1].key
    elapsed = time.perf_counter() - t
    await store.close()
    return elapsed * 1000


def list_sessions_ms(address: str) -> float:
    stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(address))
    t, token = time.perf_counter(), ""
    while True:
        page = stub.ListSessions(pb.ListSessionsRequest(page_size=PAGE, page_token=token), timeout=60)
        token = page.next_page_token
        if not token:
            return (time.perf_counter() - t) * 1000


def measure(runs: int) -> tuple[dict[str, float], list[Figure]]:
    floors: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-all-") as tmp:
        progress("starting the stack of `holdfast up --hosts 2` (etcd on disk, fsync on)")
        bench = Bench(Path(tmp))
        try:
            assert bench.stack.etcd is not None
            url = bench.stack.etcd.url
            progress("floors: etcd write, gRPC unary, fork/exec, interpreter + grpc")
            floors["etcd write"] = p50_ms(asyncio.run(etcd_write_samples(url, 300)))
            health = health_pb2_grpc.HealthStub(grpc.insecure_channel(bench.host1.agent_address))
            floors["gRPC unary"] = p50_ms(timed(lambda: health.Check(health_pb2.HealthCheckRequest()), 500))
            floors["fork/exec"] = p50_ms(timed(lambda: subprocess.run(["sh", "-c", "true"], check=True), 100))
            interpreter = timed(import_grpc(bench.host2), 5)
            floors["3 get+CAS"] = 3000 / asyncio.run(direct_cas(url, 1, 300))
            floors["get+CAS/s, 32 tasks on 32 keys"] = asyncio.run(
                direct_cas(url, 32, 40, distinct_keys=True))

            progress(f"takeover after kill -9, {runs} runs")
            crash = []
            for i in range(runs):
                crash.append(bench.crash_takeover(i))
                progress(f"  takeover {i + 1}/{runs}: {crash[-1] * 1000:.1f} ms")
            progress(f"cooperative handoff and free start, {runs} runs each")
            coop, free = [], []
            for i in range(runs):
                # The interpreter floor is sampled between the runs it is held against, so a
                # neighbour's load moves both alike (it moved this floor from 66 to 103 ms).
                interpreter += timed(import_grpc(bench.host2), 1)
                took, base = bench.cooperative(i)
                coop.append(took)
                free.append(base)
                progress(f"  handoff {i + 1}/{runs}: {took * 1000:.1f} ms (free start {base * 1000:.1f} ms)")

            floors["interpreter + grpc"] = p50_ms(interpreter)

            progress("full cycles: 1 client, then 32 clients on distinct sessions")
            _, split = asyncio.run(cycles(bench.stack.address, 1, bench.host1))
            rate32, _ = asyncio.run(cycles(bench.stack.address, 32, bench.host1))
            progress("ProbeSession of a live remote owner, 500 calls")
            probe_p50, _ = asyncio.run(probe_latency(bench.stack.address, bench.host1))
            progress(f"ListSessions over {LIST_RECORDS:,} records")
            asyncio.run(populate(url, LIST_RECORDS))
            bare_ms = asyncio.run(bare_range_ms(url))
            listed_ms = list_sessions_ms(bench.stack.address)  # first listing: every record parsed
            relisted_ms = list_sessions_ms(bench.stack.address)  # again: the coordinator's decoded records
        finally:
            bench.stop()

    takeover_floor = 3 * floors["etcd write"] + 2 * floors["gRPC unary"] + floors["fork/exec"]
    start_floor = floors["interpreter + grpc"] + 2 * floors["gRPC unary"]
    cycle_floor = floors["3 get+CAS"] + 2 * floors["gRPC unary"]
    figures = [
        Figure("takeover after kill -9, p50 (kill → next CMD running)", p50_ms(crash), "ms",
               "L = 3 etcd writes + 2 unaries + fork/exec", takeover_floor, 3),
        Figure("takeover after kill -9, p99", pct(crash, 0.99) * 1000, "ms", "L", takeover_floor, 8),
        Figure("`run` on a free session, p50 (start → CMD running)", p50_ms(free), "ms",
               "F = interpreter + grpc + 2 unaries", start_floor, 1.4),
        Figure("cooperative handoff, p50 (run --takeover start → CMD running)", p50_ms(coop), "ms",
               "the free start", p50_ms(free), 1.05),
        Figure("full cycle, 1 client (Acquire committing its gate, then Release)", sum(split.values()), "ms",
               "3 bare get+CAS + 2 bare unaries", cycle_floor, 2),
        Figure("full cycles, 32 clients on distinct sessions", rate32, "/s",
               "bare get+CAS/s, 32 tasks on 32 keys", floors["get+CAS/s, 32 tasks on 32 keys"], 0.1,
               higher_is_better=True),
        Figure("ProbeSession of a live remote owner, p50", probe_p50, "ms", "2 bare unaries",
               2 * floors["gRPC unary"], 2.5),
        Figure(f"ListSessions over {LIST_RECORDS:,} records (pages of {PAGE}), first listing", listed_ms,
               "ms", "bare etcd range, same keys and pages", bare_ms, 2),
        Figure(f"ListSessions over {LIST_RECORDS:,} records, listed again", relisted_ms, "ms",
               "bare etcd range, same keys and pages", bare_ms, 2),
    ]
    return floors, figures


def run_bench(script: str, *args: str) -> dict[str, Any]:
    """One of the scale benches, in its own process (each starts its own etcd, coordinator and
    simulated hosts), read back from its --json."""
    progress(f"{script} {' '.join(args)}")
    done = subprocess.run([sys.executable, str(BENCH / script), *args, "--json"], check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout)


def scale_figures() -> list[Figure]:
    """The scale goals of issue 16, each against the same measure at small scale (or the goal)."""
    scale = run_bench("bench_scale.py", "--records", str(SCALE_RECORDS))
    load = run_bench("bench_takeover_load.py", "--owners", "1000", "--samples", "10")
    hosts = run_bench("bench_hosts.py", "--hosts", "50")
    records = f"{SCALE_RECORDS:,} records"
    return [
        Figure(f"Acquire p50 at {records}", scale["acquire_p50_ms_at_n"], "ms", "the same at 10 records",
               scale["acquire_p50_ms_at_10"], 1.2),
        Figure(f"coordinator RSS after listing {records}", scale["rss_mb_large"], "MB", "the goal itself",
               RSS_GOAL_MB, 1),
        Figure("WatchSessions p99 until 100 watchers of one session have a change", scale["watch_p99_ms_100"],
               "ms", "the same for 1 watcher", scale["watch_p99_ms_1"], 10),
        Figure("takeover p50, 1,000 live owners on the owner's host", load["takeover_p50_ms_crowded"], "ms",
               "the same with 1 live owner", load["takeover_p50_ms_alone"], 1.2),
        Figure("ProbeSession p50 of a live owner among 999 on its host", load["probe_p50_ms_crowded"], "ms",
               "the same with 1 live owner", load["probe_p50_ms_alone"], None),
        Figure("cycle p50 visiting each of 50 hosts in turn", hosts["cycle_p50_ms_every_host"], "ms",
               "the same on one host", hosts["cycle_p50_ms_one_host"], None),
    ]


@dataclass
class CpuFigure:
    figure: str
    value: float
    unit: str
    goal: float | None  # at most this; None: measured and shown, no goal

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.value <= self.goal


def cpu_figures(cycles: int) -> tuple[dict[str, object], list[CpuFigure]]:
    """bench_cpu.py's figures, each against the issue's absolute goal."""
    cpu = run_bench("bench_cpu.py", "--cycles", str(cycles), "--probes", str(cycles))
    cycle, resident, probe = cpu["cycle_cpu_ms"], cpu["resident_cycle_cpu_ms"], cpu["probe_cpu_ms"]
    etcd = cpu["etcd_requests_per_cycle"]
    figures = [
        CpuFigure("coordinator CPU per full cycle (resident client)", resident["coordinator"], "ms", 2.5),
        CpuFigure("agent CPU per full cycle (resident client)", resident["agent"], "ms", 1.5),
        CpuFigure("etcd CPU per full cycle (resident client)", resident["etcd"], "ms", None),
        CpuFigure("coordinator CPU per full cycle (`run` started beside it)", cycle["coordinator"], "ms",
                  None),
        CpuFigure("agent CPU per full cycle (`run` started beside it)", cycle["agent"], "ms", None),
        CpuFigure("etcd CPU per full cycle (`run` started beside it)", cycle["etcd"], "ms", None),
        CpuFigure("etcd Txn requests per full cycle", etcd["Txn"], "", 3),
        CpuFigure("etcd Range requests per full cycle", etcd["Range"], "", 1),
        CpuFigure("etcd Watch streams opened per full cycle", etcd["Watch"], "", None),
        CpuFigure("etcd proposals committed per full cycle", etcd["proposals committed"], "", None),
        CpuFigure("coordinator CPU per ProbeSession of a live owner", probe["coordinator"], "ms", 0.5),
        CpuFigure("agent CPU per ProbeSession of a live owner", probe["agent"], "ms", None),
        CpuFigure("coordinator RSS per waiting `run`", cpu["coordinator_rss_kb_per_waiter"], "KB", 20),
        CpuFigure("coordinator CPU per waiting `run`", cpu["waiter_cpu_ms_per_s"]["coordinator"], "ms/s",
                  None),
        CpuFigure("full cycles per coordinator core (derived)", cpu["coordinator_cycles_per_core_s"], "/s",
                  None),
    ]
    return cpu, figures


def cpu_table(cpu: dict[str, object], figures: list[CpuFigure]) -> str:
    idle = ", ".join(f"{k} {v:.2f} ms/s" for k, v in cpu["idle_cpu_ms_per_s"].items())  # type: ignore[attr-defined]
    lines = [f"CPU per operation: {cpu['method']}, over {cpu['cycles']} cycles (idle rates: {idle})", "",
             "| figure | value | goal | met |", "|---|---|---|---|"]
    lines += [f"| {f.figure} | {f.value:.2f} {f.unit} | "
              f"{'-' if f.goal is None else f'<= {f.goal:g} {f.unit}'} | {MET[f.met]} |" for f in figures]
    return "\n".join(lines)


def table(floors: dict[str, float], figures: list[Figure]) -> str:
    lines = ["| floor | measured |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} {'/s' if name.endswith('/s') or '/s,' in name else 'ms'} |"
              for name, value in floors.items()]
    lines += ["", "| figure | value | floor | floor value | ratio | goal | met |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {f.figure} | {f.value:.2f} {f.unit} | {f.floor_name} | {f.floor:.2f} {f.unit} | "
              f"{f.ratio:.2f}x | {f.goal} | {MET[f.met]} |" for f in figures]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="takeovers and handoffs to measure (default 15)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--quick", action="store_true",
                        help="skip the scale figures (100,000 records, 1,000 owners, 50 hosts)")
    args = parser.parse_args()
    started = time.monotonic()
    pressure = cpu_pressure_avg60()
    floors, figures = measure(args.runs)
    if not args.quick:
        figures += scale_figures()
    cpu, cpu_rows = cpu_figures(1000)
    if args.json:
        rows = [{**asdict(f), "ratio": f.ratio, "goal": f.goal, "met": f.met} for f in figures]
        print(json.dumps({"floors": floors, "seconds": round(time.monotonic() - started, 1),
                          "cpu_pressure_avg60_before": pressure, "figures": rows,
                          "cpu_per_operation": {"measured": cpu,
                                                "figures": [{**asdict(f), "met": f.met} for f in cpu_rows]}},
                         indent=2))
    else:
        print(table(floors, figures))
        print()
        print(cpu_table(cpu, cpu_rows))
        before = "unknown" if pressure is None else f"{pressure:.1f}%"
        print(f"\n(bench/all took {time.monotonic() - started:.0f} s; CPU pressure before it, some avg60: "
              f"{before})")


if __name__ == "__main__":
    main()
