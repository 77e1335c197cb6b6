"""Coordinator benchmarks: full acquire → commit → release cycles (1 and 32 clients), next to bare
etcd CAS transactions from this process; ProbeSession latency for a remote owner. Prints numbers;
asserts nothing. Run: .venv/bin/python bench/bench_coordinator.py
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from holdfast.common import spawn_tokens
from holdfast.coordinator.store import Put, Store, absent, mod_equals
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb

CYCLES_PER_CLIENT = 20


def report(out: dict[str, float | int], as_json: bool) -> None:
    """A scale bench's numbers: one JSON object (what bench/all reads), or one `name: value` a line."""
    if as_json:
        print(json.dumps(out, indent=2))
        return
    for name, value in out.items():
        print(f"{name}: {value:.2f}" if isinstance(value, float) else f"{name}: {value}")


def start(argv: list[str], ready: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "holdfast.cli", *argv, "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{argv[:2]} did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["address"]


async def direct_cas(url: str, tasks: int, per_task: int, distinct_keys: bool = False) -> float:
    """get+CAS transactions per second from this process: `tasks` tasks on one key, or each on its own."""
    store = Store.connect(url, prefix=f"/bench-direct-{secrets.token_hex(4)}/")
    keys = [store.key(f"k{i}" if distinct_keys else "k") for i in range(tasks)]
    for key in set(keys):
        await store.txn([absent(key)], [Put(key, b"0")])

    async def loop(key: str) -> int:
        done = 0
        while done < per_task:
            entry = await store.get(key)
            ok, _ = await store.txn([mod_equals(key, entry.mod_revision)], [Put(key, b"x")])  # type: ignore[union-attr]
            done += ok
        return done

    t = time.perf_counter()
    total = sum(await asyncio.gather(*(loop(key) for key in keys)))
    rate = total / (time.perf_counter() - t)
    await store.close()
    return rate


def register_host(coordinator: str, host: SimulatedHost) -> None:
    """Registers a simulated host's agent for 60 s (enough for one benchmark)."""
    info = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(host.agent_address)).GetHostInfo(
        apb.GetHostInfoRequest()
    )
    reg = pb.HostRegistration(host_id=host.host_id, address=host.agent_address, incarnation=info.incarnation,
                              spawn_token_env=info.spawn_token_env)
    coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator)).RegisterHost(
        pb.RegisterHostRequest(registration=reg, ttl_seconds=60)
    )


async def spawn_owner(host: SimulatedHost) -> tuple[asyncio.subprocess.Process, pb.GateSpawn]:
    """A gate as `run` spawns it before its Acquire: a token carrier inside the simulated host
    (exits when its stdin closes), and what an Acquire that commits it at its grant carries."""
    secret = spawn_tokens.mint_spawn_secret()
    child = await asyncio.create_subprocess_exec(
        "nsenter",
        "--target",
        str(host.reaper_pid),
        "--pid",
        "--mount",
        "--",
        "sh",
        "-c",
        "echo $$; read x",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={host.spawn_token_env: spawn_tokens.spawn_token_for(secret), "PATH": os.environ["PATH"]},
    )
    # The carrier prints its pid inside the host: it runs now, and the pid is the attestation hint.
    pid = int(await child.stdout.readline())  # type: ignore[union-attr]
    return child, pb.GateSpawn(pid_hint=pid, token_secret=secret, spawn_token_env=host.spawn_token_env)


async def own(coord: coordinator_pb2_grpc.CoordinatorStub, host: SimulatedHost,
              sid: str) -> tuple[asyncio.subprocess.Process, pb.Grant]:
    """A live owner of `sid` on `host`: its gate spawned, then committed by its grant."""
    child, gate = await spawn_owner(host)
    g = (await coord.Acquire(pb.AcquireRequest(session_id=sid, host_id=host.host_id, live_on_commit=True,
                                               operation_id=secrets.token_hex(16), gate=gate))).grant
    return child, g


async def end_owner(child: asyncio.subprocess.Process) -> None:
    child.stdin.close()  # type: ignore[union-attr]
    await child.wait()


async def cycles(address: str, clients: int, host: SimulatedHost) -> tuple[float, dict[str, float]]:
    """Full cycles as `run` makes them: Acquire (committing its gate at the grant), then Release once
    the gate has exited. The gate's spawn and exit are the client's own work, not timed."""
    split = {"acquire and commit": 0.0, "release": 0.0}
    async with grpc.aio.insecure_channel(address) as channel:
        coord = coordinator_pb2_grpc.CoordinatorStub(channel)

        async def client(i: int) -> None:
            sid = f"bench-{clients}-{i:04d}"
            for _ in range(CYCLES_PER_CLIENT):
                child, gate = await spawn_owner(host)
                t0 = time.perf_counter()
                g = (await coord.Acquire(pb.AcquireRequest(session_id=sid, host_id=host.host_id,
                                                           live_on_commit=True, gate=gate,
                                                           operation_id=secrets.token_hex(16)))).grant
                t1 = time.perf_counter()
                await end_owner(child)
                t2 = time.perf_counter()
                await coord.Release(pb.ReleaseRequest(session_id=sid, fence=g.fence, secret=g.secret))
                t3 = time.perf_counter()
                split["acquire and commit"] += t1 - t0
                split["release"] += t3 - t2

        t = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - t
    n = clients * CYCLES_PER_CLIENT
    return n / elapsed, {k: v / n * 1000 for k, v in split.items()}


async def probe_latency(address: str, host: SimulatedHost, n: int = 500) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        coord = coordinator_pb2_grpc.CoordinatorStub(channel)
        child, _ = await own(coord, host, "bench-probe-1")
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            await coord.ProbeSession(pb.ProbeSessionRequest(session_id="bench-probe-1"))
            samples.append((time.perf_counter() - t) * 1000)
        await end_owner(child)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="holdfast-bench-"))
    etcd = EtcdServer(root / "etcd", fast_election=True).start()
    procs: list[subprocess.Popen[bytes]] = []
    host = SimulatedHost("bench-host", 60, root / "host")
    try:
        host.start()
        coord, addr = start(
            ["coordinator", "serve", "--etcd", etcd.url, "--listen", "127.0.0.1:0"], root / "coord.json"
        )
        procs.append(coord)
        register_host(addr, host)
        on_tmpfs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(root)], capture_output=True, text=True
        ).stdout
        print(f"etcd data dir {root} on {on_tmpfs.strip()}")
        for n in (1, 32):
            cas = asyncio.run(direct_cas(etcd.url, n, 200))
            rate, split = asyncio.run(cycles(addr, n, host))
            print(
                f"{n:>2} clients: {rate:7.1f} full cycles/s; per cycle ms "
                + ", ".join(f"{k} {v:.2f}" for k, v in split.items())
                + f" | direct get+CAS {cas:7.1f}/s (a cycle is 3 record txns)"
            )
        p50, p99 = asyncio.run(probe_latency(addr, host))
        print(f"ProbeSession (coordinator -> agent -> back): p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    finally:
        host.stop()
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(10)
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
