"""Agent benchmarks (goals, never test assertions). Prints figures and ratios from one run:

- scan of 1,000 live processes: holdfast.proc.scan vs the seeds' approach (read every environ as
  text, split on NUL) vs psutil, side by side;
- ProbeOwners round trip p50/p99 vs a bare unary health check on the same channel;
- WatchExits latency from kill -9 to the event, p50/p99;
- agent RSS idle and after 10,000 probes.

Run as root: .venv/bin/python bench/bench_agent.py
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from holdfast.proc.scan import scan
from holdfast.v1 import agent_pb2, agent_pb2_grpc

VAR = "HOLDFAST_SPAWN_TOKEN"
N_PROCS = 1000


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def seed_scan(token: str) -> list[int]:
    """The seeds' scan: every environ read as text, split on NUL, parsed into a map."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/environ").read_text("utf-8", errors="replace")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
        if env.get(VAR) == token:
            found.append(int(entry))
    return found


def psutil_scan(token: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(VAR) == token:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def bench_scan() -> None:
    token = secrets.token_hex(16)
    # 1,000 live processes with ordinary environments; ten of them carry the token (one session tree).
    procs = [subprocess.Popen(["sleep", "120"], env={**os.environ, **({VAR: token} if i < 10 else {})})
             for i in range(N_PROCS)]
    try:
        live = sum(1 for e in os.listdir("/proc") if e.isdigit())
        assert len(scan(VAR.encode(), token.encode()).carriers) == 10
        assert len(seed_scan(token)) == len(psutil_scan(token)) == 10
        per = N_PROCS / live  # normalise to 1,000 processes
        ours = median_ms(lambda: scan(VAR.encode(), token.encode()), 15) * per
        seed = median_ms(lambda: seed_scan(token), 15) * per
        ps = median_ms(lambda: psutil_scan(token), 7) * per
        print(f"scan per 1,000 processes ({live} live): holdfast {ours:.2f} ms | seed approach "
              f"{seed:.2f} ms ({seed / ours:.1f}x slower) | psutil {ps:.2f} ms ({ps / ours:.1f}x slower)")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_agent() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        argv = [sys.executable, "-m", "holdfast.cli", "agent", "serve",
                "--listen", "127.0.0.50:0", "--host-id", "bench", "--ready-file", str(ready)]
        agent = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        child = None
        try:
            deadline = time.monotonic() + 15
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            channel = grpc.insecure_channel(json.loads(ready.read_text())["address"])
            stub = agent_pb2_grpc.HostAgentStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            token = secrets.token_hex(16)
            child = subprocess.Popen(["sleep", "300"], env={**os.environ, VAR: token})
            attest = agent_pb2.AttestSpawnRequest(spawn_token=token, pid_hint=child.pid)
            identity = stub.AttestSpawn(attest).identity
            time.sleep(0.3)
            idle = rss_kb(agent.pid)
            req = agent_pb2.ProbeOwnersRequest(owners=[identity])
            hreq = health_pb2.HealthCheckRequest()
            probe_t, health_t = [], []
            for _ in range(10_000):
                t = time.perf_counter()
                stub.ProbeOwners(req)
                probe_t.append((time.perf_counter() - t) * 1e6)
            for _ in range(10_000):
                t = time.perf_counter()
                health.Check(hreq)
                health_t.append((time.perf_counter() - t) * 1e6)
            after = rss_kb(agent.pid)
            p50, p99, h50, h99 = pct(probe_t, .5), pct(probe_t, .99), pct(health_t, .5), pct(health_t, .99)
            print(f"ProbeOwners round trip: p50 {p50:.0f} us, p99 {p99:.0f} us | health check "
                  f"p50 {h50:.0f} us, p99 {h99:.0f} us | ratio p50 {p50 / h50:.2f}x, p99 {p99 / h99:.2f}x")
            print(f"agent RSS: idle {idle / 1024:.1f} MB, after 10,000 probes {after / 1024:.1f} MB")
            lat = []
            for _ in range(50):
                tok = secrets.token_hex(16)
                victim = subprocess.Popen(["sleep", "300"], env={**os.environ, VAR: tok})
                attest = agent_pb2.AttestSpawnRequest(spawn_token=tok, pid_hint=victim.pid)
                ident = stub.AttestSpawn(attest).identity
                stream = stub.WatchExits(agent_pb2.WatchExitsRequest(owners=[ident]), timeout=10)
                assert next(stream).armed  # the watch is in place
                t = time.perf_counter()
                os.kill(victim.pid, signal.SIGKILL)
                event = next(stream)
                lat.append((time.perf_counter() - t) * 1000)
                assert event.result.outcome == agent_pb2.EXIT_OBSERVED
                stream.cancel()
                victim.wait()
            print(f"WatchExits kill -9 -> event: p50 {pct(lat, .5):.2f} ms, "
                  f"p99 {pct(lat, .99):.2f} ms (50 kills)")
            channel.close()
        finally:
            if child is not None:
                child.kill()
                child.wait()
            agent.terminate()
            agent.wait(10)


if __name__ == "__main__":
    bench_scan()
    bench_agent()
