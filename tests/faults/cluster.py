"""The fault cluster on one machine: 3 etcd members, 2 coordinator replicas, 3 simulated hosts, and
a fault proxy in front of every etcd member, every coordinator, every agent's link to its
coordinator and every agent's own listener.

With `tls`, everything speaks mTLS (etcd on its own CA) with `holdfast certs init`'s certificates
in `pki`, and `pki/rogue/` holds a runtime certificate of another tenant ("rogue"). With `fencing`,
the coordinators fence lost hosts with the simulated-host fence agent
(tests/integration/standins/fence_simhost, whose `off` kills the host's PID namespace); every start
of a host writes the `<host>.reaper` file that agent reads, so it always names the live namespace.

Guarantee: everything listens on 127.0.0.0/8 only; `stop()` ends every process it started, by pid,
after resuming any it paused (a stopped process cannot be ended by SIGTERM). Clients, agents and
coordinators reach etcd, coordinators and agents only through proxies, so a link can be cut
without killing anything. Each agent listens on a fixed port of its host's address (the same after
a reboot) and registers its proxy's address (`--advertise`), so coordinators probe through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from holdfast.common import certs, tls
from holdfast.common.tls import Role
from holdfast.localstack.etcd_server import EtcdServer, free_port
from holdfast.localstack.simhost import SimulatedHost
from tests.faults.proxy import FaultProxy, ProxyLoop
from tests.integration.coordinator_fixtures import Coordinator

# 3 members on 2 loaded cores: below 50/500 the leader churns (docs/design.md §8); 100/1000 leaves room
# for the coordinators, agents and runs that share those cores.
CLUSTER_ELECTION_MS = (100, 1000)
HOST_INDEXES = (150, 151, 152)  # 127.0.0.150..152: disjoint from the integration fixtures' ranges
FENCER = Path(__file__).parents[1] / "integration" / "standins" / "fence_simhost"
HOST_LOSS_AFTER = 2.0  # the coordinators' host_loss_after with fencing on
FENCE_TIMEOUT = 10.0


@dataclass
class FaultCluster:
    tmp: Path
    seed: int
    proxies: ProxyLoop = field(default_factory=ProxyLoop)
    etcd: list[EtcdServer] = field(default_factory=list)
    etcd_proxies: list[FaultProxy] = field(default_factory=list)
    coordinators: list[Coordinator] = field(default_factory=list)
    coordinator_proxies: list[FaultProxy] = field(default_factory=list)
    hosts: list[SimulatedHost] = field(default_factory=list)
    agent_links: list[FaultProxy] = field(default_factory=list)  # host i → its coordinator
    probe_links: list[FaultProxy] = field(default_factory=list)  # coordinators → host i's agent
    paused: set[int] = field(default_factory=set)
    tls: bool = False
    fencing: bool = False

    @property
    def pki(self) -> Path | None:
        return self.tmp / "pki" if self.tls else None

    @property
    def fencer_dir(self) -> Path:
        return self.tmp / "fencer"

    def fencing_args(self) -> tuple[str, ...]:
        if not self.fencing:
            return ()
        self.fencer_dir.mkdir(exist_ok=True)
        fencers = [{"hosts": "h*", "program": str(FENCER),
                    "options": {"plug": "{host}", "hosts_dir": str(self.fencer_dir),
                                "log": str(self.fencer_dir / "fencer.log")}}]
        return ("--fencers", json.dumps(fencers), "--host-loss-after", str(HOST_LOSS_AFTER),
                "--fence-timeout", str(FENCE_TIMEOUT), "--fence-retry-seconds", "0.5")

    def mark(self, host: SimulatedHost) -> None:
        """Tells the fencer which PID 1 is this host's now (each start makes a new one)."""
        if self.fencing:
            reaper = host.reaper_pid
            stat = Path(f"/proc/{reaper}/stat").read_text()
            ticks = stat[stat.rfind(")") + 2:].split()[19]
            (self.fencer_dir / f"{host.host_id}.reaper").write_text(f"{reaper} {ticks}")

    def reboot(self, host: SimulatedHost) -> None:
        host.reboot()
        self.mark(host)

    def channel(self, address: str, role: str = "operator") -> grpc.Channel:
        """A channel to a coordinator presenting `role`'s certificate (mTLS), or plaintext."""
        if self.pki is None:
            return grpc.insecure_channel(address)
        return tls.open_channel(address, self.pki, Role(role), sync=True)  # type: ignore[return-value]

    def start(self) -> FaultCluster:
        pki = self.pki
        if pki is not None:
            certs.init_local(pki, [f"h{i}" for i in range(len(HOST_INDEXES))], ["127.0.0.1", "localhost"])
            certs.issue_one(pki, Role("client", "", "rogue"), [], pki / "rogue")
        members = [EtcdServer(self.tmp / f"etcd{i}", name=f"m{i}", election_ms=CLUSTER_ELECTION_MS,
                              client_port=free_port(), peer_port=free_port(),
                              tls_dir=pki / "etcd" if pki else None) for i in range(3)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for m in members:
            m.initial_cluster = initial
            self.etcd.append(m.launch())
        for m in members:
            m.wait_healthy(30)
        self.etcd_proxies = [self.proxies.add(f"etcd{i}", f"127.0.0.1:{m.client_port}", seed=self.seed + i)
                             for i, m in enumerate(members)]
        scheme = "https" if pki else "http"
        endpoints = ",".join(f"{scheme}://{p.address}" for p in self.etcd_proxies)
        tls_args = ("--tls-dir", str(pki)) if pki else ()
        prefix = f"/holdfast-faults/{uuid.uuid4().hex}/"
        for i in range(2):
            state = self.tmp / f"coordinator{i}"
            state.mkdir()
            self.coordinators.append(Coordinator(endpoints, state, prefix,
                                                 args=(*tls_args, *self.fencing_args())).start(30))
        self.coordinator_proxies = [self.proxies.add(f"coordinator{i}", c.address, seed=self.seed + 10 + i)
                                    for i, c in enumerate(self.coordinators)]
        for i, index in enumerate(HOST_INDEXES):
            link = self.proxies.add(f"agent-link{i}", self.coordinator_proxies[i % 2].address,
                                    seed=self.seed + 20 + i)
            self.agent_links.append(link)
            listen = f"127.0.0.{index}:{free_port(f'127.0.0.{index}')}"
            probe = self.proxies.add(f"probe-link{i}", listen, seed=self.seed + 30 + i)
            self.probe_links.append(probe)
            host = SimulatedHost(f"h{i}", index, self.tmp / f"h{i}", agent_args=[
                "--coordinator", link.address, "--listen", listen, "--advertise", probe.address, *tls_args])
            host.start(30)
            self.mark(host)
            self.hosts.append(host)
        return self

    def coordinator_address(self, i: int) -> str:
        return self.coordinator_proxies[i].address

    def agent_pid(self, host: SimulatedHost) -> int:
        pid = self.running_agent(host)
        assert pid is not None, f"{host.host_id} is down"
        return pid

    def running_agent(self, host: SimulatedHost) -> int | None:
        """The host's agent, None when the host is down: a fence powers a host off (its reaper
        killed) whenever its registration lapses, unknown to the workload that started it."""
        reaper = host.reaper_pid
        try:
            kids = Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split()
        except FileNotFoundError:
            return None
        return int(kids[0]) if kids else None  # the reaper's first child is the agent (simhost.REAPER)

    def leader(self) -> int | None:
        return next((i for i, m in enumerate(self.etcd) if m.process and m.is_leader()), None)

    def pause(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.paused.add(pid)

    def resume(self, pid: int) -> None:
        self.paused.discard(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def restart_etcd(self, i: int) -> None:
        self.etcd[i].launch().wait_healthy(30)

    def heal_all(self) -> None:
        for pid in list(self.paused):
            self.resume(pid)
        for proxy in self.proxies.proxies:
            self.proxies.heal(proxy)
        for i, m in enumerate(self.etcd):
            if m.process is None or m.process.poll() is not None:
                self.restart_etcd(i)
        for c in self.coordinators:
            if c.process is None or c.process.poll() is not None:
                c.start(30)
        for host in self.hosts:
            if not host.running:
                self.reboot(host)
        time.sleep(0.5)

    def stop(self) -> None:
        for pid in list(self.paused):
            self.resume(pid)
        for host in self.hosts:
            host.stop()
        for c in self.coordinators:
            c.stop()
        for m in self.etcd:
            m.stop()
        self.proxies.close()
