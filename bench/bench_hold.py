"""What the owner's watch riding its grant's call (Hold) saves: resident cycles making a library's
calls (Acquire, then WatchSessions after the grant's revision) and `run`'s (Hold), alternated on
one stack of `holdfast up --hosts 1`, each server's CPU from its own cgroup (bench_cpu.py's method:
`cpu.stat` usage_usec, its idle rate subtracted). With `--release-on-call`, what the release riding
that call too saves: cycles of Hold, then a Release call, alternated with cycles of Own, whose
release is sent and answered on the call (`run`'s now).

Each watch is kept open for `--hold-ms` (20 ms) before its gate ends, as an owner's is for as long
as CMD runs: a watch cancelled at once may end before the coordinator has started it at etcd, and
costs less than any owner's does. The same wait is in both kinds of cycle. Prints numbers; asserts
nothing. Needs root. Run: .venv/bin/python bench/bench_hold.py [--cycles N] [--rounds R]
[--release-on-call] [--tls] [--json]
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
from typing import Any

import grpc
from bench_coordinator import end_owner, spawn_owner
from bench_cpu import SESSIONS, CpuBench, own, release_on_call, say

from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

Opener = Callable[[coordinator_pb2_grpc.CoordinatorStub, pb.AcquireRequest],
                  Awaitable[tuple[pb.Grant, grpc.aio.Call]]]
# How a cycle lets go once its gate has ended: (the stub, the watch's call, the grant).
Releaser = Callable[[coordinator_pb2_grpc.CoordinatorStub, Any, pb.Grant], Awaitable[None]]


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


async def release_by_call(coordinator: coordinator_pb2_grpc.CoordinatorStub, watch: grpc.aio.Call,
                          grant: pb.Grant) -> None:
    watch.cancel()
    await coordinator.Release(pb.ReleaseRequest(session_id=grant.session_id, fence=grant.fence,
                                                secret=grant.secret))


async def release_on_own(_coordinator: coordinator_pb2_grpc.CoordinatorStub,
                         call: grpc.aio.StreamStreamCall, grant: pb.Grant) -> None:
    await release_on_call(call, grant)


async def cycle(bench: CpuBench, kind: tuple[Opener, Releaser], session: str, hold_s: float) -> None:
    """A gate spawned, the session acquired and watched as the kind's opener does, the watch kept
    `hold_s`, the gate ended, and the grant released as its releaser does."""
    opener, releaser = kind
    async with bench.channel() as channel:
        coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
        child, gate = await spawn_owner(bench.host)
        grant, watch = await opener(coordinator, pb.AcquireRequest(
            session_id=session, host_id=bench.host.host_id, live_on_commit=True, gate=gate,
            operation_id=secrets.token_hex(16)))
        await asyncio.sleep(hold_s)
        await end_owner(child)
        await releaser(coordinator, watch, grant)


def one(bench: CpuBench, calls: tuple[Opener, Releaser], hold_s: float, i: int) -> None:
    asyncio.run(cycle(bench, calls, f"{bench.tag}-hold-{i % SESSIONS:03d}", hold_s))


KINDS: dict[str, tuple[Opener, Releaser]] = {"acquire+watch": (acquire_then_watch, release_by_call),
                                             "hold": (hold, release_by_call)}
# --release-on-call: `run`'s cycle before Own against its cycle now.
ON_CALL: dict[str, tuple[Opener, Releaser]] = {"hold+release": (hold, release_by_call),
                                               "own": (own, release_on_own)}


def measure(cycles: int, rounds: int, hold_s: float, kinds: dict[str, tuple[Opener, Releaser]],
            use_tls: bool = False) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-hold-") as tmp:
        say("starting the stack of `holdfast up --hosts 1`, each server in a cgroup of its own")
        bench = CpuBench(Path(tmp), use_tls)
        try:
            say(f"warming up: 20 cycles, then each of the {SESSIONS} sessions made by a cycle of each kind")
            for i in range(20):
                bench.cycle(i)
            ops = {kind: functools.partial(one, bench, calls, hold_s) for kind, calls in kinds.items()}
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
    parser.add_argument("--release-on-call", action="store_true",
                        help="alternate Hold + a Release call with Own, released on its call")
    parser.add_argument("--tls", action="store_true",
                        help="every link mTLS (`holdfast up --tls`), cycles as clients of the default tenant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = measure(args.cycles, args.rounds, args.hold_ms / 1000, ON_CALL if args.release_on_call else KINDS,
                  args.tls)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for row in out:
        cpu = ", ".join(f"{k} {v:.3f} ms" for k, v in row["cpu_ms"].items())  # type: ignore[attr-defined]
        print(f"round {row['round']} {row['kind']:>13}: {cpu}; etcd {row['etcd_requests']}")


if __name__ == "__main__":
    main()
