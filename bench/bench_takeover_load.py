"""Takeover latency with one live owner on the owner's host, then with many: what the stable scan
of the owner host's processes (part of every proof that a tree is gone) costs as a node fills up.
A waiting Acquire from the second host is answered when the owner's carrier exits; measured from
the exit (the carrier's stdin closed) to the grant. Beside it, ProbeSession of a live owner, which
reads no process list, alone and in the crowd. Prints numbers; asserts nothing.
Run as root: .venv/bin/python bench/bench_takeover_load.py [--owners N] [--samples K] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coordinator import end_owner, own, register_host, report, start

from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

WAIT_SETTLE_S = 0.2  # for the waiting Acquire to reach the owner's agent: no event says so


async def takeovers(address: str, owner_host: SimulatedHost, taker: SimulatedHost, tag: str,
                    samples: int) -> list[float]:
    """ms from an owner's exit to the waiting taker's grant, `samples` times."""
    out = []
    async with grpc.aio.insecure_channel(address) as channel:
        coord = coordinator_pb2_grpc.CoordinatorStub(channel)
        for i in range(samples):
            sid = f"load-{tag}-{i:04d}"
            child, _ = await own(coord, owner_host, sid)
            waiting = asyncio.ensure_future(coord.Acquire(pb.AcquireRequest(
                session_id=sid, host_id=taker.host_id, wait_seconds=30, operation_id=secrets.token_hex(16))))
            await asyncio.sleep(WAIT_SETTLE_S)
            t = time.perf_counter()
            await end_owner(child)
            await waiting
            out.append((time.perf_counter() - t) * 1000)
    return out


def progress(message: str) -> None:
    print(f"[bench_takeover_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def probe_p50(address: str, session: str, calls: int = 100) -> float:
    """ms, median of ProbeSession on `session` (a live owner: HELD)."""
    async with grpc.aio.insecure_channel(address) as channel:
        coord = coordinator_pb2_grpc.CoordinatorStub(channel)
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            await coord.ProbeSession(pb.ProbeSessionRequest(session_id=session))
            out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


async def measure(address: str, owner_host: SimulatedHost, taker: SimulatedHost, owners: int,
                  samples: int) -> dict[str, float]:
    out: dict[str, float] = {"owners": owners}
    alone = await takeovers(address, owner_host, taker, "alone", samples)
    out["takeover_p50_ms_alone"] = statistics.median(alone)
    progress(f"takeover with 1 live owner on its host: p50 {out['takeover_p50_ms_alone']:.2f} ms")
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        coord = coordinator_pb2_grpc.CoordinatorStub(channel)
        first, _ = await own(coord, owner_host, "load-filler-00000")
        out["probe_p50_ms_alone"] = await probe_p50(address, "load-filler-00000")
        fillers = [first]
        fillers += [(await own(coord, owner_host, f"load-filler-{i:05d}"))[0] for i in range(1, owners - 1)]
    try:
        progress(f"{len(fillers)} more live owners committed on {owner_host.host_id} in "
                 f"{time.perf_counter() - started:.1f} s")
        out["probe_p50_ms_crowded"] = await probe_p50(address, "load-filler-00000")
        out["probe_ratio"] = out["probe_p50_ms_crowded"] / out["probe_p50_ms_alone"]
        crowded = await takeovers(address, owner_host, taker, "crowded", samples)
        out["takeover_p50_ms_crowded"] = statistics.median(crowded)
        out["takeover_ratio"] = out["takeover_p50_ms_crowded"] / out["takeover_p50_ms_alone"]
    finally:
        for child in fillers:
            await end_owner(child)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--owners", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="holdfast-bench-load-"))
    etcd = EtcdServer(root / "etcd", fast_election=True).start()
    hosts = [SimulatedHost("load-host-a", 64, root / "a"), SimulatedHost("load-host-b", 65, root / "b")]
    coord = None
    try:
        for host in hosts:
            host.start()
        coord, address = start(["coordinator", "serve", "--etcd", etcd.url, "--listen", "127.0.0.1:0"],
                               root / "coord.json")
        for host in hosts:
            register_host(address, host)
        out = asyncio.run(measure(address, hosts[0], hosts[1], args.owners, args.samples))
    finally:
        for host in hosts:
            host.stop()
        if coord is not None:
            coord.terminate()
            coord.wait(20)
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        report(out, as_json=True)
        return
    print(f"takeover with 1 live owner on its host: p50 {out['takeover_p50_ms_alone']:.2f} ms")
    print(f"ProbeSession of a live owner, alone: p50 {out['probe_p50_ms_alone']:.2f} ms; "
          f"among {args.owners - 1}: p50 {out['probe_p50_ms_crowded']:.2f} ms ({out['probe_ratio']:.2f}x)")
    print(f"takeover with {args.owners} live owners on its host: p50 {out['takeover_p50_ms_crowded']:.2f} ms "
          f"({out['takeover_ratio']:.2f}x)")


if __name__ == "__main__":
    main()
