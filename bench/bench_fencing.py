"""A lost host, fenced: how long from its registration's lapse to the next owner's CMD running.

A real etcd, a coordinator fencing with the simulated-host fence agent
(tests/integration/standins/fence_simhost: `off` kills the host's PID namespace, `status` reads the
kernel), two simulated hosts whose agents register with `registration_ttl` 2 s, and
`host_loss_after` 5 s. Each run: an owner `sleep 600` on host A, a `run --wait` on host B (its CMD
prints the time it runs), then A's whole namespace is SIGKILLed (a power loss). The lapse is when
A's registration is first seen gone (ListHosts polled every 5 ms from the kill); the figure is that
to B's CMD running, and, beside it, from the kill. Host A then starts again (a new incarnation).

Prints numbers; asserts nothing. Needs root. Run: .venv/bin/python bench/bench_fencing.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost, wait_for
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
FENCER = ROOT / "tests" / "integration" / "standins" / "fence_simhost"
CLI = [sys.executable, "-m", "holdfast.cli"]
TTL, LOSS = 2, 5.0
WAITING_SETTLE_S = 1.5  # for B's `run --wait` to sit in its Acquire: no event says so
STAMP = ["date", "+%s.%N"]


def ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.etcd = EtcdServer(tmp / "etcd").start()
        fencers = [{"hosts": "bench-*", "program": str(FENCER),
                    "options": {"plug": "{host}", "hosts_dir": str(tmp), "log": str(tmp / "fencer.log")}}]
        ready = tmp / "coordinator.json"
        self.coordinator = subprocess.Popen(
            [*CLI, "coordinator", "serve", "--etcd", self.etcd.url, "--listen", "127.0.0.1:0",
             "--ready-file", str(ready), "--fencers", json.dumps(fencers), "--host-loss-after", str(LOSS),
             "--fence-timeout", "10"], stdout=subprocess.DEVNULL, stderr=open(tmp / "coordinator.log", "ab"))  # noqa: SIM115
        wait_for("the coordinator", ready.exists, 20)
        self.address = json.loads(ready.read_text())["address"]
        self.stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(self.address))
        args = ["--coordinator", self.address, "--registration-ttl", str(TTL)]
        self.lost = SimulatedHost("bench-lost", 160, tmp / "lost", agent_args=args)
        self.other = SimulatedHost("bench-other", 161, tmp / "other", agent_args=args)
        for host in (self.lost, self.other):
            self.start(host)

    def registered(self) -> set[str]:
        return {h.host_id for h in self.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts}

    def start(self, host: SimulatedHost) -> None:
        try:
            host.start()
        except RuntimeError:
            print((host.state_dir / f"agent-{host.host_id}.log").read_text()[-3000:], file=sys.stderr)
            raise
        reaper = host.reaper_pid
        (self.tmp / f"{host.host_id}.reaper").write_text(f"{reaper} {ticks(reaper)}")
        wait_for(f"{host.host_id} registered", lambda: host.host_id in self.registered(), 30)

    def run(self, host: SimulatedHost, session: str, *options: str,
            cmd: list[str] = STAMP) -> subprocess.Popen[bytes]:
        env = {**os.environ, "HOLDFAST_HOST_ID": host.host_id, "HOLDFAST_COORDINATOR": self.address}
        with open(self.tmp / f"{session}-{host.host_id}.err", "wb") as err:
            return host.spawn([*CLI, "run", "--session", session, *options, "--", *cmd], env=env,
                              stdout=subprocess.PIPE, stderr=err)

    def live(self, session: str) -> bool:
        try:
            lease = self.stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=5).record.lease
        except grpc.RpcError:
            return False
        return lease.claim_status == pb.LIVE

    def lost_host(self, i: int) -> tuple[float, float]:
        session = f"bench-lost-{i:04d}"
        owner = self.run(self.lost, session, cmd=["sleep", "600"])
        wait_for("the owner", lambda: self.live(session), 30)
        waiter = self.run(self.other, session, "--wait", "120")
        time.sleep(WAITING_SETTLE_S)
        killed = time.time()
        os.kill(self.lost.reaper_pid, signal.SIGKILL)  # power loss: the whole namespace ends
        wait_for("the lapse", lambda: self.lost.host_id not in self.registered(), 30)
        lapsed = time.time()
        line = waiter.stdout.readline()  # type: ignore[union-attr]
        if not line:
            said = (self.tmp / f"{session}-{self.other.host_id}.err").read_text()
            raise RuntimeError(f"the waiter ended before its CMD ran (exit {waiter.wait(30)}): {said}")
        ran = float(line)
        waiter.wait(30)
        owner.wait(10)
        self.start(self.lost)  # a new incarnation for the next run
        return ran - lapsed, ran - killed

    def stop(self) -> None:
        for host in (self.lost, self.other):
            host.stop()
        self.coordinator.send_signal(signal.SIGTERM)
        self.coordinator.wait(15)
        self.etcd.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="holdfast-bench-fencing-") as tmp:
        bench = Bench(Path(tmp))
        try:
            from_lapse, from_kill = [], []
            for i in range(args.runs):
                lapse, kill = bench.lost_host(i)
                from_lapse.append(lapse)
                from_kill.append(kill)
                print(f"lost host {i + 1}/{args.runs}: {lapse:.2f} s from the lapse, {kill:.2f} s from the "
                      "kill", file=sys.stderr)
        finally:
            bench.stop()
    for name, values in (("lapse -> next CMD running", from_lapse),
                         ("kill -> next CMD running", from_kill)):
        print(f"{name}: p50 {statistics.median(values):.2f} s, p99 {pct(values, 0.99):.2f} s, "
              f"max {max(values):.2f} s (n={len(values)}; registration_ttl {TTL} s, "
              f"host_loss_after {LOSS} s)")


if __name__ == "__main__":
    main()
