"""What the owner's watch riding its grant's call (Hold) saves: resident cycles making a library's
calls (Acquire, then WatchSessions after the grant's revision) and `run`'s (Hold), alternated on
one stack of `holdfast up --hosts 1`, each server's CPU from its own cgroup (bench_cpu.py's method:
`cpu.stat` usage_usec, its idle rate subtracted).

Each watch is kept open for `--hold-ms` (20 ms) before its gate ends, as an owner's is for as long
as CMD runs: a watch cancelled at once may end before the coordinator has started it at etcd, and
costs less than any owner's does. The same wait is in both kinds of cycle. Prints numbers; asserts
nothing. Needs root. Run: .venv/bin/python bench/bench_hold.py [--cycles N] [--rounds R] [--tls]
[--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from bench_coordinator import end_owner, spawn_owner
from bench_cpu import SESSIONS, CpuBench, say

from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

Opener = Callable[[coordinator_pb2_grpc.CoordinatorStub, pb.AcquireRequest],
                  Awaitable[tuple[pb.Grant, grpc.aio.Call]]]


async def acquire_then_watch(coordinator: coordinator_pb2_grpc.CoordinatorStub,
                             request: pb.AcquireRequest) -> tuple[pb.Grant, grpc.aio.Call]:
    granted = await coordinator.Acquire(request)
    watch = coordinator.WatchSessions(pb.WatchSessionsRequest(session_id=request.session_id,
                                                              after_revision=granted.revision))
    await watch.read()  # its opening event: the call is served
    return granted.grant, watch


async def hold(coordinator: coordinator_pb2_grpc.CoordinatorStub,
               request: pb.AcquireRequest) -> tuple[pb.Grant, grpc.aio.Call]:
    held = coordinator.Hold(request)
    return (await held.read()).granted.grant, held


async def cycle(bench: CpuBench, opener: Opener, session: str, hold_s: float) -> None:
    """A gate spawned, the session acquired and watched as `opener` does, the watch kept `hold_s`,
    the gate ended, the watch cancelled, Release."""
    async with bench.channel() as channel:
        coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
        child, gate = await spawn_owner(bench.host)
        grant, watch = await opener(coordinator, pb.AcquireRequest(
            session_id=session, host_id=bench.host.host_id, live_on_commit=True, gate=gate,
            operation_id=secrets.token_hex(16)))
        await asyncio.sleep(hold_s)
        await end_owner(child)
        watch.cancel()
        await coordinator.Release(pb.ReleaseRequest(session_id=session, fence=grant.fence,
                                                    secret=grant.secret))


def one(bench: CpuBench, opener: Opener, hold_s: float, i: int) -> None:
    asyncio.run(cycle(bench, opener, f"{bench.tag}-hold-{i % SESSIONS:03d}", hold_s))


KINDS: dict[str, Opener] = {"acquire+watch": acquire_then_watch, "hold": hold}


def measure(cycles: int, rounds: int, hold_s: float, use_tls: bool = False) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-hold-") as tmp:
        say("starting the stack of `holdfast up --hosts 1`, each server in a cgroup of its own")
        bench = CpuBench(Path(tmp), use_tls)
        try:
            say(f"warming up: 20 cycles, then each of the {SESSIONS} sessions made by a cycle of each kind")
            for i in range(20):
                bench.cycle(i)
            ops = {kind: functools.partial(one, bench, opener, hold_s) for kind, opener in KINDS.items()}
            # A session's first grant writes more than later ones: no measured cycle makes one.
            for i, op in itertools.product(range(SESSIONS), ops.values()):
                op(i)
            idle = bench.idle_rates()
            for r in range(rounds):
                for kind, op in ops.items():
                    cpu, requests, _ = bench.per_op(cycles, op, idle, f"round {r + 1} {kind}")
                    out.append({"round": r + 1, "kind": kind, "cpu_ms": {k: v / 1000 for k, v in cpu.items()},
                                "etcd_requests": {k: v / cycles for k, v in requests.items()
                                                  if abs(v) / cycles >= 0.01}})
        finally:
            bench.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hold-ms", type=float, default=20.0)
    parser.add_argument("--tls", action="store_true",
                        help="every link mTLS (`holdfast up --tls`), cycles as clients of the default tenant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = measure(args.cycles, args.rounds, args.hold_ms / 1000, args.tls)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for row in out:
        cpu = ", ".join(f"{k} {v:.3f} ms" for k, v in row["cpu_ms"].items())  # type: ignore[attr-defined]
        print(f"round {row['round']} {row['kind']:>13}: {cpu}; etcd {row['etcd_requests']}")


if __name__ == "__main__":
    main()
