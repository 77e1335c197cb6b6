"""Scale: one coordinator over 100,000 session records. Acquire latency at 10 records and at 100,000
(same run), the coordinator's resident memory, ListSessions over all of them, what one session costs
etcd in keys and bytes, and WatchSessions fan-out (100 watchers of one session against one).
Prints numbers; asserts nothing. Run: .venv/bin/python bench/bench_scale.py [--records N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coordinator import report, start
from bench_coordinator_list import populate, rss_mb

from holdfast.coordinator.store import DEFAULT_PREFIX, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

HOST = "scale-host"
SAMPLES = 200


def progress(message: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def register(stub: coordinator_pb2_grpc.CoordinatorStub) -> threading.Event:
    """A registration the grants need; its agent is never called (free sessions need no probe).
    Heartbeats keep it while the bench runs; set the returned event to stop them."""
    reg = pb.HostRegistration(host_id=HOST, address="127.0.0.1:9", spawn_token_env="HOLDFAST_SPAWN_TOKEN")
    lease = stub.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=30)).lease_id
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(5):
            stub.Heartbeat(pb.HeartbeatRequest(host_id=HOST, lease_id=lease), timeout=5)

    threading.Thread(target=beat, daemon=True).start()
    return stop


def acquire_release(stub: coordinator_pb2_grpc.CoordinatorStub, session: str) -> tuple[float, pb.Grant]:
    t = time.perf_counter()
    grant = stub.Acquire(pb.AcquireRequest(session_id=session, host_id=HOST,
                                           operation_id=secrets.token_hex(16))).grant
    took = time.perf_counter() - t
    stub.Release(pb.ReleaseRequest(session_id=session, fence=grant.fence, secret=grant.secret))
    return took, grant


def acquire_p50_ms(stub: coordinator_pb2_grpc.CoordinatorStub, tag: str) -> float:
    return statistics.median(acquire_release(stub, f"scale-{tag}-{i:06d}")[0] for i in range(SAMPLES)) * 1000


def list_all_ms(stub: coordinator_pb2_grpc.CoordinatorStub) -> tuple[float, int]:
    t, token, seen = time.perf_counter(), "", 0
    while True:
        page = stub.ListSessions(pb.ListSessionsRequest(page_size=500, page_token=token), timeout=60)
        seen += len(page.records)
        token = page.next_page_token
        if not token:
            return (time.perf_counter() - t) * 1000, seen


async def footprint(url: str, session: str) -> dict[str, tuple[int, int]]:
    """Per kind of key: how many keys, and their bytes (keys + values), etcd holds for one session."""
    store = Store.connect(url, prefix=DEFAULT_PREFIX)
    try:
        kinds = {}
        for kind in ("sessions", "fence", "history", "ops", "data"):
            entries, _ = await store.list_prefix(store.key(kind, session))
            mine = [e for e in entries
                    if e.key == store.key(kind, session) or e.key.startswith(store.key(kind, session) + "/")]
            kinds[kind] = (len(mine), sum(len(e.key) + len(e.value) for e in mine))
        return kinds
    finally:
        await store.close()


async def fan_out(address: str, watchers: int, changes: int) -> list[float]:
    """Per change (an Acquire then a Release of one session): ms from the Acquire's call until every
    watcher has its event."""
    session = f"scale-watch-{watchers:03d}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        g = (await stub.Acquire(pb.AcquireRequest(session_id=session, host_id=HOST,
                                                  operation_id=secrets.token_hex(16)))).grant
        await stub.Release(pb.ReleaseRequest(session_id=session, fence=g.fence, secret=g.secret))
        queues: list[asyncio.Queue[tuple[int, float]]] = [asyncio.Queue() for _ in range(watchers)]
        calls = [stub.WatchSessions(pb.WatchSessionsRequest(session_id=session)) for _ in range(watchers)]

        async def follow(call, queue: asyncio.Queue[tuple[int, float]]) -> None:  # type: ignore[no-untyped-def]
            async for event in call:
                queue.put_nowait((event.record.lease.fence, time.perf_counter()))

        tasks = [asyncio.create_task(follow(c, q)) for c, q in zip(calls, queues, strict=True)]
        for q in queues:  # each watcher's initial listing: the watch is established
            await q.get()
        spreads = []
        for _ in range(changes):
            t = time.perf_counter()
            g = (await stub.Acquire(pb.AcquireRequest(session_id=session, host_id=HOST,
                                                      operation_id=secrets.token_hex(16)))).grant
            arrivals = []
            for q in queues:
                while True:
                    fence, at = await q.get()
                    if fence == g.fence:
                        arrivals.append(at)
                        break
            spreads.append((max(arrivals) - t) * 1000)
            await stub.Release(pb.ReleaseRequest(session_id=session, fence=g.fence, secret=g.secret))
            for q in queues:  # the release's event
                await q.get()
        for task in tasks:
            task.cancel()
        for call in calls:
            call.cancel()
        return spreads


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, float | int] = {}
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-scale-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root / "etcd", fast_election=True).start()
        coord, address = start(["coordinator", "serve", "--etcd", etcd.url, "--listen", "127.0.0.1:0"],
                               root / "coord.json")
        stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(address))
        stop = register(stub)
        try:
            progress("Acquire at 10 records")
            for i in range(10):
                acquire_release(stub, f"scale-seed-{i:06d}")
            out["acquire_p50_ms_at_10"] = acquire_p50_ms(stub, "small")
            out["rss_mb_small"] = rss_mb(coord.pid)
            for _ in range(10):  # one session with ten cycles: its footprint in etcd
                acquire_release(stub, "scale-footprint-1")
            for kind, (keys, nbytes) in asyncio.run(footprint(etcd.url, "scale-footprint-1")).items():
                out[f"one session after 10 cycles: {kind} keys"] = keys
                out[f"one session after 10 cycles: {kind} bytes"] = nbytes
            progress(f"writing {args.records:,} released session records")
            t = time.perf_counter()
            asyncio.run(populate(etcd.url, args.records))
            out["populate_s"] = time.perf_counter() - t
            progress(f"Acquire at {args.records:,} records")
            out["acquire_p50_ms_at_n"] = acquire_p50_ms(stub, "large")
            out["acquire_ratio"] = out["acquire_p50_ms_at_n"] / out["acquire_p50_ms_at_10"]
            progress(f"ListSessions over {args.records:,} records")
            out["list_all_ms"], out["listed"] = list_all_ms(stub)
            out["rss_mb_large"] = rss_mb(coord.pid)
            db = root / "etcd" / "member" / "snap" / "db"
            out["etcd_db_mb"] = db.stat().st_size / 2**20 if db.exists() else float("nan")
            progress("WatchSessions: 1 watcher, then 100 watchers of one session, 30 changes each")
            one = asyncio.run(fan_out(address, 1, 30))
            hundred = asyncio.run(fan_out(address, 100, 30))
            out["watch_p99_ms_1"], out["watch_p99_ms_100"] = pct(one, 0.99), pct(hundred, 0.99)
            out["watch_ratio"] = out["watch_p99_ms_100"] / out["watch_p99_ms_1"]
        finally:
            stop.set()
            os.kill(coord.pid, signal.SIGTERM)
            coord.wait(20)
            etcd.stop()
    report(out, args.json)


if __name__ == "__main__":
    main()
