"""CPU per operation, from each server's own accounting: etcd, the coordinator and the agent each in a
cgroup v2 of its own, `cpu.stat` `usage_usec` read around every measured span, and each one's idle
rate (measured over a quiet span of the same stack just before) subtracted. Figures in CPU time do
not depend on how many cores the machine has or who else runs on it; wall time does.

Measured on the stack of `holdfast up --hosts 1` (etcd on disk, fsync on):
- a full cycle: `holdfast run --session S -- true` started inside the simulated host, sequentially
  (acquire → gate attested → commit → CMD → exit watch → release), over 100 sessions in turn;
- the same cycle from a resident client: the RPCs `run` makes, in its order (a gate spawned, a
  Hold committing it and kept open as the owner's watch, the gate ended, the Hold cancelled,
  Release), on a new channel each time as a new `run` has, from this process. Each `run`
  is a fresh interpreter whose start (~100 ms of CPU, right beside the servers on this machine)
  leaves every server's caches cold: measured, it adds ~1.5 to 2.5 ms to each of etcd, the
  coordinator and the agent per cycle, etcd included, which no holdfast change reaches. In a
  cluster `run` starts on another machine than the coordinator, so this figure is the
  coordinator's own work;
- ProbeSession of a live owner on the host, from this process;
- a waiting `run` (`run --wait` on a session another `run` holds): the coordinator's RSS and CPU
  per waiter while nothing changes;
- etcd's requests per cycle from its own /metrics (grpc_server_started_total), with its committed
  proposals.

`--profile DIR` also records the coordinator's and agent's stacks during the cycles with py-spy
(250 Hz, only the thread holding the GIL: Python's own work, not gRPC's core threads) and prints
each one's top functions by own and total samples; a profiled run's CPU figures are not to quote.
Prints numbers; asserts nothing. Needs root. Run: .venv/bin/python bench/bench_cpu.py [--cycles N]
[--json] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_coordinator import end_owner, spawn_owner

from holdfast.common import env, tls
from holdfast.localstack.simhost import SimulatedHost, wait_for
from holdfast.localstack.up import Stack
from holdfast.proc import cgroups
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

CLI = [sys.executable, "-m", "holdfast.cli"]
SESSIONS = 100  # a cycle's session: one of these in turn (each acquired again once released)
IDLE_S = 10.0
ETCD_METHODS = ("Range", "Txn", "Put", "DeleteRange", "Watch", "LeaseGrant", "LeaseKeepAlive", "LeaseRevoke")
SERVERS = ("etcd", "coordinator", "agent")


class CpuGroup:
    """A cgroup v2 of its own for one server process (and every thread and child it has), whose
    `cpu.stat` usage_usec is that process's CPU, whatever else runs on the machine."""

    def __init__(self, parent: Path, name: str, pid: int) -> None:
        self.path = parent / name
        self.path.mkdir()
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pid = pid

    def usage_us(self) -> int:
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value)
        raise RuntimeError(f"{self.path}/cpu.stat has no usage_usec")

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"/proc/{self.pid}/status has no VmRSS")


class Span:
    """CPU of each server over one measured span, less what it spends idle over the same time."""

    def __init__(self, groups: dict[str, CpuGroup], idle_us_per_s: dict[str, float] | None) -> None:
        self.groups, self.idle = groups, idle_us_per_s or {}
        self.start_us = {name: g.usage_us() for name, g in groups.items()}
        self.started = time.monotonic()

    def end(self) -> tuple[float, dict[str, float]]:
        """(seconds, {server: CPU µs over the span with its idle rate subtracted})."""
        used = {name: g.usage_us() - self.start_us[name] for name, g in self.groups.items()}
        seconds = time.monotonic() - self.started
        return seconds, {name: us - self.idle.get(name, 0.0) * seconds for name, us in used.items()}


def etcd_counts(url: str, etcd_tls: Path | None = None) -> collections.Counter[str]:
    """etcd's gRPC requests started, by method, and its committed proposals (from its /metrics;
    with `etcd_tls`, etcd's CA directory, as the coordinator, whose certificate etcd takes)."""
    counts: collections.Counter[str] = collections.Counter()
    context = None
    if etcd_tls is not None:
        context = ssl.create_default_context(cafile=str(etcd_tls / "ca.pem"))
        context.load_cert_chain(etcd_tls / "coordinator.pem", etcd_tls / "coordinator.key")
    with urllib.request.urlopen(f"{url}/metrics", timeout=10, context=context) as page:  # 127.0.0.1
        for raw in page.read().decode().splitlines():
            if raw.startswith("grpc_server_started_total{"):
                labels, value = raw.rsplit(" ", 1)
                method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
                counts[method] += int(float(value))
            elif raw.startswith("etcd_server_proposals_committed_total "):
                counts["proposals committed"] = int(float(raw.rsplit(" ", 1)[1]))
    return counts


class CpuBench:
    def __init__(self, root: Path, use_tls: bool = False) -> None:
        self.root = root
        # The coordinator's /metrics says how many Acquires it holds open (the waiters' event).
        os.environ["HOLDFAST_COORDINATOR_METRICS_LISTEN"] = "127.0.0.1:0"
        self.stack = Stack(root / "state", "127.0.0.1:0", hosts=1, ip_base=170, use_tls=use_tls)
        self.groups: dict[str, CpuGroup] = {}
        # Its sessions' ids, and so the session cgroups its agent makes, are named for this bench
        # alone: the cleanup in `stop` never reaches another bench's.
        self.tag = f"bench-cpu-{secrets.token_hex(4)}"
        self.parent = Path(cgroups.cgroup2_root()) / f"holdfast-{self.tag}"
        self.stack.start()
        try:
            self._place()
        except BaseException:
            self.stop()
            raise

    def _place(self) -> None:
        self.host: SimulatedHost = self.stack.simhosts[0]
        self.env = {**os.environ, "HOLDFAST_HOST_ID": self.host.host_id,
                    **({env.TLS_DIR: str(self.stack.tls_dir)} if self.stack.tls_dir else {}),
                    "HOLDFAST_COORDINATOR": self.stack.address}
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel(sync=True))
        assert self.stack.etcd is not None and self.stack.etcd.process is not None and self.stack.coordinator
        self.parent.mkdir()
        agent = wait_for("the agent", lambda: (_children(self.host.reaper_pid) or [0])[0], 5.0)
        for name, pid in (("etcd", self.stack.etcd.process.pid), ("coordinator", self.stack.coordinator.pid),
                          ("agent", agent)):
            self.groups[name] = CpuGroup(self.parent, name, pid)

    @property
    def etcd_tls(self) -> Path | None:
        return self.stack.tls_dir / tls.ETCD_SUBDIR if self.stack.tls_dir else None

    @property
    def etcd_url(self) -> str:
        assert self.stack.etcd is not None
        return self.stack.etcd.url

    def run(self, session: str, *options: str, cmd: tuple[str, ...] = ("true",),
            stdout: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        return self.host.spawn([*CLI, "run", "--session", session, *options, "--", *cmd], env=self.env,
                               stdout=stdout, stderr=subprocess.DEVNULL)

    def cycle(self, i: int) -> None:
        if (code := self.run(f"{self.tag}-{i % SESSIONS:03d}").wait(60)) != 0:
            raise RuntimeError(f"run {i} exited {code}")

    def channel(self, sync: bool = False) -> Any:
        """A channel to the coordinator as a `run` opens it: a client certificate of the default
        tenant with --tls (so each session call is judged for its tenant), plaintext otherwise."""
        return tls.open_channel(self.stack.address, self.stack.tls_dir, tls.Role("client"), sync=sync)

    def resident_cycle(self, i: int) -> None:
        asyncio.run(self._resident_cycle(f"{self.tag}-resident-{i % SESSIONS:03d}"))

    async def _resident_cycle(self, session: str) -> None:
        async with self.channel() as channel:
            coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
            child, gate = await spawn_owner(self.host)
            held = coordinator.Hold(pb.AcquireRequest(
                session_id=session, host_id=self.host.host_id, live_on_commit=True, gate=gate,
                operation_id=secrets.token_hex(16)))
            grant = (await held.read()).granted.grant
            await end_owner(child)
            held.cancel()
            await coordinator.Release(pb.ReleaseRequest(session_id=session, fence=grant.fence,
                                                        secret=grant.secret))

    def idle_rates(self) -> dict[str, float]:
        """Each server's CPU µs per second, and etcd's requests per second ("etcd Range", ...),
        over a span where nothing is asked of the stack (heartbeats, the census, compaction)."""
        before = etcd_counts(self.etcd_url, self.etcd_tls)
        span = Span(self.groups, None)
        time.sleep(IDLE_S)  # the quiet span itself is what is measured: nothing happens in it
        seconds, used = span.end()
        after = etcd_counts(self.etcd_url, self.etcd_tls)
        requests = {f"etcd {k}": (after[k] - before[k]) / seconds for k in after}
        return {**{name: us / seconds for name, us in used.items()}, **requests}

    def per_op(self, n: int, op: Callable[[int], object], idle: dict[str, float],
               progress: str) -> tuple[dict[str, float], dict[str, float], float]:
        """CPU µs per op for each server, etcd's requests over the span, and ops per wall second
        (each with its idle rate subtracted)."""
        before = etcd_counts(self.etcd_url, self.etcd_tls)
        span = Span(self.groups, idle)
        for i in range(n):
            op(i)
            if (i + 1) % max(n // 10, 1) == 0:
                say(f"  {progress} {i + 1}/{n}")
        seconds, used = span.end()
        after = etcd_counts(self.etcd_url, self.etcd_tls)
        requests = {k: after[k] - before[k] - idle.get(f"etcd {k}", 0.0) * seconds for k in after}
        return {name: us / n for name, us in used.items()}, requests, n / seconds

    def live_owner(self, session: str) -> subprocess.Popen[bytes]:
        """A `run` holding `session` with CMD running: its CMD prints once it runs (the event)."""
        owner = self.run(session, cmd=("sh", "-c", "echo up; exec sleep 600"), stdout=subprocess.PIPE)
        if owner.stdout is None or owner.stdout.readline() != b"up\n":
            raise RuntimeError(f"the owner of {session} did not start")
        return owner

    def probes(self, n: int, idle: dict[str, float]) -> dict[str, float]:
        owner = self.live_owner(f"{self.tag}-probed")
        try:
            request = pb.ProbeSessionRequest(session_id=f"{self.tag}-probed")
            per, _, _ = self.per_op(n, lambda _i: self.stub.ProbeSession(request, timeout=30), idle,
                                    "ProbeSession")
        finally:
            end(owner)
        return per

    def waiters(self, n: int, idle: dict[str, float]) -> tuple[float, dict[str, float]]:
        """RSS (KB) and CPU (µs/s) of the coordinator per waiting `run`, while nothing changes."""
        owners = [self.live_owner(f"{self.tag}-held-{i:03d}") for i in range(n)]
        rss_before = self.groups["coordinator"].rss_kb()
        waiting = [self.run(f"{self.tag}-held-{i:03d}", "--wait", "600") for i in range(n)]
        try:
            wait_for(f"{n} waiting runs", lambda: self.waiting() >= n, 60.0)
            rss_after = self.groups["coordinator"].rss_kb()
            span = Span(self.groups, idle)
            time.sleep(IDLE_S)  # the span a waiter sits idle in is what is measured
            seconds, used = span.end()
        finally:
            for proc in [*waiting, *owners]:
                end(proc)
        return (rss_after - rss_before) / n, {name: us / seconds / n for name, us in used.items()}

    def waiting(self) -> int:
        """Acquires the coordinator holds open (its holdfast_coordinator_acquires_waiting gauge)."""
        metrics = json.loads((self.stack.state_dir / "coordinator.ready").read_text())["metrics"]
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
            for line in page.read().decode().splitlines():
                if line.startswith("holdfast_acquires_waiting "):
                    return int(float(line.split()[1]))
        return 0

    def stop(self) -> None:
        self.stack.stop()
        for group in self.groups.values():
            group.path.rmdir()
        if self.parent.exists():
            self.parent.rmdir()
        # The session cgroups this bench's agent made (an agent sweeps them only while it runs):
        # each named for a session id only this bench uses; rmdir leaves any populated one.
        for made in self.parent.parent.glob(f"holdfast-{self.tag}-*"):
            with contextlib.suppress(OSError):
                made.rmdir()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def end(proc: subprocess.Popen[bytes]) -> None:
    """Ends a `run` this bench started (its nsenter's child, by pid), and reaps the nsenter. With
    SIGINT, as a Ctrl-C: a `run` still waiting for its grant then removes its grant directory (a
    killed one leaves it for the next `run` of that pid namespace, and a simulated host's namespace
    has none)."""
    for pid in _children(proc.pid):
        os.kill(pid, signal.SIGINT)
    proc.wait(30)


def say(line: str) -> None:
    print(f"[bench_cpu {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


class Profiler:
    """py-spy recording one server's stacks over a span, as raw collapsed stacks."""

    def __init__(self, out: Path, name: str, pid: int) -> None:
        self.out = out / f"{name}.txt"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate", "250",
             "--format", "raw", "--output", str(self.out), "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.send_signal(2)  # py-spy writes its file on SIGINT
        self.proc.wait(60)

    def top(self, n: int = 15) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
        """The n functions with the most own samples and with the most total samples."""
        own: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        samples = 0
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f.rsplit(":", 1)[0] for f in stack.split(";")]
            samples += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                total[frame] += int(count)
        return own.most_common(n), total.most_common(n), samples


def measure(cycles: int, probes: int, waiters: int, profile: Path | None,
            use_tls: bool = False) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-cpu-") as tmp:
        say("starting the stack of `holdfast up --hosts 1`, each server in a cgroup of its own")
        bench = CpuBench(Path(tmp), use_tls)
        try:
            say("warming up: 20 cycles")
            for i in range(20):
                bench.cycle(i)
            say(f"idle rates over {IDLE_S:g} s")
            idle = bench.idle_rates()
            profiled = ("coordinator", "agent") if profile else ()
            profilers = [Profiler(profile, name, bench.groups[name].pid) for name in profiled]
            say(f"{cycles} full cycles (`run -- true`, sequential)")
            cycle_cpu, requests, rate = bench.per_op(cycles, bench.cycle, idle, "cycles")
            for p in profilers:
                p.stop()
            say(f"{cycles} full cycles from a resident client (the RPCs of `run`, in its order)")
            resident_cpu, resident_requests, _ = bench.per_op(cycles, bench.resident_cycle, idle, "cycles")
            say(f"{probes} ProbeSession calls of a live owner")
            probe_cpu = bench.probes(probes, idle)
            say(f"{waiters} waiting runs, idle for {IDLE_S:g} s")
            rss_per_waiter, waiter_cpu = bench.waiters(waiters, idle) if waiters else (0.0, {})
        finally:
            bench.stop()
    out: dict[str, object] = {
        "method": "cgroup v2 cpu.stat usage_usec per server, its idle rate subtracted"
                  + (", every link mTLS, clients of the default tenant" if use_tls else ", plaintext"),
        "cycles": cycles,
        "idle_cpu_ms_per_s": {k: idle[k] / 1000 for k in SERVERS},
        "idle_etcd_requests_per_s": {k.removeprefix("etcd "): v for k, v in idle.items() if k not in SERVERS},
        "cycle_cpu_ms": {k: v / 1000 for k, v in cycle_cpu.items()},
        "etcd_requests_per_cycle": {k: requests.get(k, 0.0) / cycles
                                    for k in (*ETCD_METHODS, "proposals committed")},
        "cycles_per_s_wall_sequential": rate,
        "resident_cycle_cpu_ms": {k: v / 1000 for k, v in resident_cpu.items()},
        "resident_etcd_requests_per_cycle": {k: resident_requests.get(k, 0.0) / cycles
                                             for k in (*ETCD_METHODS, "proposals committed")},
        "coordinator_cycles_per_core_s": 1e6 / max(resident_cpu["coordinator"], 1.0),
        "probes": probes,
        "probe_cpu_ms": {k: v / 1000 for k, v in probe_cpu.items()},
        "waiters": waiters,
        "coordinator_rss_kb_per_waiter": rss_per_waiter,
        "waiter_cpu_ms_per_s": {k: v / 1000 for k, v in waiter_cpu.items()},
    }
    for p in profilers:
        own, total, samples = p.top()
        out[f"profile_{p.out.stem}"] = {"samples": samples, "own": own, "total": total}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=1000)
    parser.add_argument("--waiters", type=int, default=40)
    parser.add_argument("--profile", type=Path,
                        help="record the coordinator's and agent's stacks with py-spy in this directory")
    parser.add_argument("--tls", action="store_true",
                        help="every link mTLS (`holdfast up --tls`), runs as clients of the default tenant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # Its runs are ended by a SIGINT forwarded to CMD: started as a shell's background job, SIGINT
    # arrives ignored, every child would inherit that, and each CMD would outlive its Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    out = measure(args.cycles, args.probes, args.waiters, args.profile, args.tls)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for key, value in out.items():
        if isinstance(value, dict) and "own" in value:
            print(f"{key} ({value['samples']} samples):")
            for kind in ("own", "total"):
                print(f"  by {kind}:")
                for frame, count in value[kind]:
                    print(f"    {count / value['samples'] * 100:5.1f}%  {frame}")
        elif isinstance(value, dict):
            print(f"{key}: " + ", ".join(f"{k} {v:.3f}" for k, v in value.items()))
        else:
            print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
