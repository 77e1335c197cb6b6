"""Many hosts: N simulated hosts (default 50), each a PID namespace on its own 127.0.0.N with a real
agent that registers and heartbeats through one coordinator. Measures how long registration takes,
what the hosts cost at rest (heartbeat RPCs and etcd lease renewals a second, coordinator and agent
CPU and memory), and whether a session cycle (Acquire, a carrier attested by its host's agent,
CommitOwner, Release) costs more when it visits every host than when it stays on one.
Prints numbers; asserts nothing. Run as root: .venv/bin/python bench/bench_hosts.py [--hosts N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coordinator import end_owner, own, report, start
from bench_coordinator_list import rss_mb

from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

FIRST_INDEX = 100  # 127.0.0.100 on: clear of `holdfast up`'s low addresses
IDLE_S = 20.0
TICKS = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"[bench_hosts {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def renewals(etcd_url: str) -> float:
    """etcd's count of lease renewals (keepalives) so far, from its /metrics; NaN if it has none."""
    with urllib.request.urlopen(f"{etcd_url}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("etcd_debugging_lease_renewed_total "):
                return float(line.split()[1])
    return float("nan")


async def cycle(stub: coordinator_pb2_grpc.CoordinatorStub, host: SimulatedHost, sid: str) -> float:
    t = time.perf_counter()
    child, g = await own(stub, host, sid)
    await end_owner(child)
    await stub.Release(pb.ReleaseRequest(session_id=sid, fence=g.fence, secret=g.secret))
    return (time.perf_counter() - t) * 1000


async def cycles(address: str, hosts: list[SimulatedHost], rounds: int) -> tuple[list[float], list[float]]:
    """Cycles on the first host only, then each round over every host, interleaved per round."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        one, every = [], []
        for r in range(rounds):
            for i, host in enumerate(hosts):
                one.append(await cycle(stub, hosts[0], f"hosts-one-{r:03d}-{i:03d}"))
                every.append(await cycle(stub, host, f"hosts-every-{r:03d}-{i:03d}"))
        return one, every


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_hosts: simulated hosts are PID namespaces; run as root")
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.hosts <= 254 - FIRST_INDEX:
        sys.exit(f"bench_hosts: --hosts must be in 1..{254 - FIRST_INDEX}")
    out: dict[str, float | int] = {"hosts": args.hosts}
    root = Path(tempfile.mkdtemp(prefix="holdfast-bench-hosts-"))
    etcd = EtcdServer(root / "etcd", fast_election=True).start()
    coord, address = start(["coordinator", "serve", "--etcd", etcd.url, "--listen", "127.0.0.1:0"],
                           root / "coord.json")
    stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(address))
    hosts: list[SimulatedHost] = []
    try:
        t = time.perf_counter()
        for i in range(args.hosts):
            host = SimulatedHost(f"bench-node-{i:03d}", FIRST_INDEX + i, root / f"node-{i:03d}",
                                 agent_args=["--coordinator", address])
            hosts.append(host)
            host.start()
            if (i + 1) % 10 == 0:
                progress(f"{i + 1} of {args.hosts} agents started")
        while len(stub.ListHosts(pb.ListHostsRequest(), timeout=10).hosts) < args.hosts:
            time.sleep(0.1)
        out["all_registered_s"] = time.perf_counter() - t
        progress(f"at rest for {IDLE_S:g} s")
        agents = [h.reaper_pid for h in hosts]
        etcd_pid = etcd.process.pid if etcd.process else 0
        cpu0 = {pid: cpu_seconds(pid) for pid in [coord.pid, etcd_pid]}
        renewed0, t0 = renewals(etcd.url), time.perf_counter()
        time.sleep(IDLE_S)
        window = time.perf_counter() - t0
        out["etcd_lease_renewals_per_s"] = (renewals(etcd.url) - renewed0) / window
        out["coordinator_cpu_percent_at_rest"] = 100 * (cpu_seconds(coord.pid) - cpu0[coord.pid]) / window
        out["etcd_cpu_percent_at_rest"] = 100 * (cpu_seconds(etcd_pid) - cpu0[etcd_pid]) / window
        out["coordinator_rss_mb"] = rss_mb(coord.pid)
        # A host's reaper, its agent and what the agent runs.
        roots = [psutil.Process(reaper) for reaper in agents]
        agent_rss = [sum(rss_mb(p.pid) for p in [root, *root.children(recursive=True)]) for root in roots]
        out["agent_rss_mb_median"] = statistics.median(agent_rss)
        out["agents_rss_mb_total"] = sum(agent_rss)
        progress(f"{args.rounds} rounds of cycles: on one host, and over all {args.hosts}")
        one, every = asyncio.run(cycles(address, hosts, args.rounds))
        out["cycle_p50_ms_one_host"] = statistics.median(one)
        out["cycle_p50_ms_every_host"] = statistics.median(every)
        out["cycle_ratio"] = out["cycle_p50_ms_every_host"] / out["cycle_p50_ms_one_host"]
    finally:
        for host in hosts:
            host.stop()
        os.kill(coord.pid, signal.SIGTERM)
        coord.wait(20)
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(out, args.json)


if __name__ == "__main__":
    main()
