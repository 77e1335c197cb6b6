"""Handoff benchmarks across two simulated hosts (the stack of `holdfast up --hosts 2`):

- takeover after a crash: `run --wait` already waiting on host 2, then `kill -9` of host 1's `run`
  and its child together; measured from the kill to host 2's new child running (exit watch on
  host 1 → re-adjudication → grant → commit → gate released → CMD's first instruction);
- cooperative handoff: `run --takeover` started on host 2 → its child running, next to the same
  `run` on a free session (the baseline: interpreter start, Acquire, gate, commit), so the
  difference is what the handoff itself costs; the old child ends on SIGTERM at once (no grace).

Prints numbers; asserts nothing. Run: .venv/bin/python bench/bench_handoff.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from holdfast.localstack.simhost import SimulatedHost
from holdfast.localstack.up import Stack
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

CLI = [sys.executable, "-m", "holdfast.cli"]
WAITING_SETTLE_S = 1.5  # for host 2's `run --wait` to start and sit in Acquire: no event says so
# CMD of a measured run: the released gate execs `date` itself, so its timestamp is CMD running, and
# reading it from the run's stdout pipe is the event (no file to poll, no shell or mv in the figure).
STAMP = ["date", "+%s.%N"]


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return found


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack = Stack(root / "state", "127.0.0.1:0", hosts=2, ip_base=150)
        self.stack.start()
        self.stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(self.stack.address))
        self.host1, self.host2 = self.stack.simhosts

    def run(self, host: SimulatedHost, session: str, *options: str,
            cmd: list[str] = STAMP) -> subprocess.Popen[bytes]:
        """`holdfast run` on `host`; its stdout is a pipe, where STAMP's CMD prints when it ran."""
        env = {**os.environ, "HOLDFAST_HOST_ID": host.host_id, "HOLDFAST_COORDINATOR": self.stack.address}
        return host.spawn([*CLI, "run", "--session", session, "--grace", "5", *options, "--", *cmd],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def live_at(self, session: str, fence: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                lease = self.stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=5).record.lease
                if lease.fence == fence and lease.claim_status == pb.LIVE:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.005)
        raise TimeoutError(f"{session} not live at fence {fence}")

    @staticmethod
    def stamped(run: subprocess.Popen[bytes]) -> float:
        line = run.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"run {run.pid} ended before its CMD printed (exit {run.wait(30)})")
        run.wait(30)
        return float(line)

    def crash_takeover(self, i: int) -> float:
        session = f"bench-crash-{i:04d}"
        first = self.run(self.host1, session, cmd=["sleep", "600"])
        self.live_at(session, 1)
        second = self.run(self.host2, session, "--wait", "60")
        time.sleep(WAITING_SETTLE_S)
        tree = [*descendants(first.pid)]
        killed_at = time.time()
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        latency = self.stamped(second) - killed_at
        first.wait(10)
        return latency

    def cooperative(self, i: int) -> tuple[float, float]:
        session = f"bench-coop-{i:04d}"
        started = time.time()
        base = self.stamped(self.run(self.host2, f"bench-free-{i:04d}")) - started
        first = self.run(self.host1, session, cmd=["sleep", "600"])
        self.live_at(session, 1)
        started = time.time()
        latency = self.stamped(self.run(self.host2, session, "--takeover")) - started
        first.wait(30)
        return latency, base

    def stop(self) -> None:
        self.stack.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(name: str, values: list[float]) -> None:
    print(f"{name}: p50 {statistics.median(values) * 1000:.1f} ms, p99 {pct(values, 0.99) * 1000:.1f} ms "
          f"(n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-handoff-") as tmp:
        bench = Bench(Path(tmp))
        try:
            crash = []
            for i in range(args.runs):
                crash.append(bench.crash_takeover(i))
                print(f"crash takeover {i + 1}/{args.runs}: {crash[-1] * 1000:.1f} ms", file=sys.stderr)
            coop, base = [], []
            for i in range(args.runs):
                took, free = bench.cooperative(i)
                coop.append(took)
                base.append(free)
                print(f"cooperative {i + 1}/{args.runs}: {took * 1000:.1f} ms (free {free * 1000:.1f} ms)",
                      file=sys.stderr)
        finally:
            bench.stop()
    show("takeover after kill -9 (kill → new child running)", crash)
    show("cooperative handoff (run --takeover start → new child running)", coop)
    show("baseline: run on a free session (start → child running)", base)
    extra = [c - b for c, b in zip(coop, base, strict=True)]
    print(f"handoff cost over the baseline: p50 {statistics.median(extra) * 1000:.1f} ms; "
          f"ratio p50 {statistics.median(coop) / statistics.median(base):.2f}x")
    print("TTL-based schemes with their documented defaults (not measured here): Kubernetes leader "
          "election 15 s lease duration; etcd concurrency session 60 s TTL — a crashed holder is "
          "replaced only after its lease runs out.")


if __name__ == "__main__":
    main()
