"""The soak: seeded random `holdfast run`s and takeovers on random hosts, random faults, and the
history they leave, judged by tests/faults/history.py.

Guarantee: every random choice comes from one `random.Random(seed)` (the seed is printed), the
soak is bounded by an operation count and a wall-clock budget, and the history is built only from
evidence outside holdfast: the children's logs (flock detector, send/ack of each FencedPut), a
sampler of the machine's process table (which child trees are alive), marker files of CMDs that
must never run, and FencedGet of every acknowledged key at the end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.localstack.simhost import SimulatedHost, ns_pid
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.faults.cluster import FaultCluster
from tests.faults.history import Event
from tests.integration import unprivileged
from tests.integration.conftest import descendants
from tests.integration.test_agent_simhost import REUSE
from tests.integration.test_run_reservation import RESERVER

PROBED = {"exit-observed", "pid-absent", "identity-mismatch"}  # evidence only an agent's probe gives
PAUSE_MARGIN_MS = 50
CHILD = Path(__file__).with_name("writer_child.py")
TAKEOVERS = ("plain", "takeover", "force", "wait")
HOSTILE = ("hopper", "dropper", "setsid", "ignore-term")
FAULTS = ("kill-child", "kill-run", "kill-agent", "kill-coordinator", "kill-etcd-member", "kill-etcd-leader",
          "pause-child", "pause-run", "pause-agent", "pause-coordinator", "cut-agent-link", "cut-probe-link",
          "cut-coordinator", "degrade-etcd", "reboot-host", "pid-reuse", "kill-before-commit", "rogue-force",
          "archive", "rogue-tenant")
LOSE_HOST = "lose-host"  # drawn only when the cluster fences lost hosts
# A lost host is waited for this long: its registration's lease (the agent's default 10 s) lapses,
# host_loss_after passes, the fence runs and its proof lands, with room for a loaded machine.
LOST_FOR_S = 25.0


@dataclass
class Launched:
    host: SimulatedHost
    proc: subprocess.Popen[bytes]
    session: str
    kind: str


@dataclass
class Soak:
    cluster: FaultCluster
    tmp: Path
    seed: int
    sessions: int = 3
    name: str = "soak"
    skip_gate: bool = False  # test-only broken client: starts CMD without `holdfast run` (no gate)
    rng: random.Random = field(init=False)
    launched: list[Launched] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    exits_1: dict[str, str] = field(default_factory=dict)  # run → its last stderr line
    faults: Counter[str] = field(default_factory=Counter)
    samples: list[tuple[int, frozenset[tuple[str, int, int]]]] = field(default_factory=list)
    # (host, from ms, to ms): the agent SIGSTOPped or its probe link cut, so no answer of it can arrive
    agent_silences: list[tuple[str, int, int]] = field(default_factory=list)
    evidence: dict[tuple[str, int], pb.DeathEvidence] = field(default_factory=dict)  # per grant
    _sampling: threading.Event = field(default_factory=threading.Event)
    archived: list[tuple[str, int]] = field(default_factory=list)  # (session, time_ns) of each archive
    # Session locks, logs, the writer script and nobody's home: runs by nobody must reach them.
    shared: Path = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.shared = unprivileged.shared_dir("holdfast-soak-")
        atexit.register(shutil.rmtree, self.shared, True)  # read until the figures are printed
        shutil.copy(CHILD, self.shared / CHILD.name)
        (self.shared / "home").mkdir(mode=0o777)
        os.chmod(self.shared / "home", 0o1777)  # nobody's TMPDIR too: one others may write must be sticky
        for session in self.session_ids():
            for suffix in (".lock", ".log"):
                (self.shared / f"{session}{suffix}").touch(mode=0o666)
                os.chmod(self.shared / f"{session}{suffix}", 0o666)
        if self.cluster is not None and self.cluster.pki is not None:  # None: a history-only Soak
            # A runtime certificate nobody's runs can read (a test's copy: a real one is the user's).
            (self.shared / "tls").mkdir(mode=0o755)
            for name in ("ca.pem", "client.pem", "client.key"):
                shutil.copy(self.cluster.pki / name, self.shared / "tls" / name)
                os.chmod(self.shared / "tls" / name, 0o644)
        print(f"fault soak seed={self.seed} (HOLDFAST_SOAK_SEED={self.seed} replays the choices)", flush=True)

    # --- workload ---------------------------------------------------------------------------
    def session_ids(self) -> list[str]:
        return [f"{self.name}-session-{i}" for i in range(self.sessions)]

    def env(self, host: SimulatedHost) -> dict[str, str]:
        coordinator = self.cluster.coordinator_address(self.rng.randrange(2))
        # TMPDIR: a run killed -9 leaves its grant directory behind; it stays in the soak's tmp.
        # XDG_STATE_HOME: takeovers' operation ids stay in the soak's tmp too, never shared with
        # another test run on this machine (run_fixtures.Cluster.env says why).
        return {**os.environ, "HOLDFAST_HOST_ID": host.host_id, "HOLDFAST_COORDINATOR": coordinator,
                "TMPDIR": str(self.tmp), "XDG_STATE_HOME": str(self.tmp / "state"),
                **({"HOLDFAST_TLS_DIR": str(self.cluster.pki)} if self.cluster.pki else {})}

    @property
    def child_script(self) -> str:
        return str(self.shared / CHILD.name)

    def session_log(self, session: str) -> Path:
        return self.shared / f"{session}.log"

    def child(self, session: str, *extra: str, python: str = sys.executable) -> list[str]:
        lock, log = self.shared / f"{session}.lock", self.session_log(session)
        return [python, self.child_script, str(lock), str(log), *extra]

    def live_hosts(self) -> list[SimulatedHost]:
        return [h for h in self.cluster.hosts if h.running]

    def fault_kinds(self) -> tuple[str, ...]:
        return (*FAULTS, LOSE_HOST) if self.cluster.fencing else FAULTS

    def launch_run(self) -> None:
        hosts = self.live_hosts()
        if not hosts:
            return
        host, session = self.rng.choice(hosts), self.rng.choice(self.session_ids())
        kind = self.rng.choice(TAKEOVERS)
        # The broken client's first run is always gateless: its soak must have something to catch.
        if self.skip_gate and (self.rng.random() < 0.5 or not self.ops["skip-gate"]):
            kind = "skip-gate"
        # Half the runs are a plain user's (the common case), a third of the trees hostile.
        as_nobody, hostile = self.rng.random() < 0.5, self.rng.random() < 0.35
        self.start_run(host, session, kind, as_nobody, self.rng.choice(HOSTILE) if hostile else "")

    def start_run(self, host: SimulatedHost, session: str, kind: str, as_nobody: bool = False,
                  hostile: str = "") -> Launched:
        """`holdfast run` of the writer child on host (kind: plain, takeover, force, wait), by root
        or by nobody, its tree well-behaved or `hostile` (writer_child.HOSTILE); or with kind
        "skip-gate" the harness's broken client: the child started with no run at all."""
        if kind == "skip-gate":
            argv = self.child(session, "--unfenced")
            env = {**os.environ, "HOLDFAST_HOST_ID": host.host_id, "HOLDFAST_SESSION": session}
        else:
            options = {"plain": [], "takeover": ["--takeover", "--handoff-timeout", "3"],
                       "force": ["--takeover", "--force", "--handoff-timeout", "2"],
                       "wait": ["--wait", "4"]}[kind]
            extra = ["--hostile", hostile] if hostile else []
            env, python, prefix = self.env(host), sys.executable, []
            if as_nobody:
                python, more = unprivileged.interpreter()
                home = str(self.shared / "home")
                env.update(more, HOME=home, TMPDIR=home, XDG_STATE_HOME=home)
                if self.cluster.pki is not None:
                    env["HOLDFAST_TLS_DIR"] = str(self.shared / "tls")
                prefix = unprivileged.DROP
            self.ops["by-nobody" if as_nobody else "by-root"] += 1
            self.ops[f"hostile-{extra[1]}" if hostile else "well-behaved"] += 1
            argv = [*prefix, python, "-m", "holdfast.cli", "run", "--session", session, *options,
                    "--grace", "1", "--", *self.child(session, *extra, python=python)]
        err = open(self.tmp / f"run-{len(self.launched)}.err", "wb")  # noqa: SIM115 - handed to the child
        with err:
            gateless = kind == "skip-gate"
            proc = host.spawn(argv, env=env, stdout=subprocess.PIPE if gateless else subprocess.DEVNULL,
                              stderr=err)
        if gateless and proc.stdout is not None:
            # Started (its first log line written) or ended (a second tree refused the lock): a
            # fault may not end it before, or a gateless child that never ran shows nothing to catch.
            with proc.stdout:
                proc.stdout.readline()
        run = Launched(host, proc, session, kind)
        self.launched.append(run)
        self.ops[kind] += 1
        return run

    def reap(self) -> None:
        for index, run in enumerate(self.launched):
            if run.proc.returncode is None and run.proc.poll() is not None:
                # Exit codes of `holdfast run` only: the harness's own reservers (killed -9 inside
                # nsenter, which then exits 1) and gate-skipping children are not holdfast's answers.
                if run.kind not in TAKEOVERS:
                    self.ops[f"{run.kind}-exit-{run.proc.returncode}"] += 1
                    continue
                self.ops[f"exit-{run.proc.returncode}"] += 1
                if run.proc.returncode == 1:  # no reason of holdfast's maps to 1 but NOT_FOUND: show why
                    self.exits_1[f"run-{index}"] = self._last_line(self.tmp / f"run-{index}.err")

    @staticmethod
    def _last_line(path: Path) -> str:
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return lines[-1][:300] if lines else "(no output)"

    # --- faults -----------------------------------------------------------------------------
    def children_alive(self) -> list[tuple[int, str, int]]:
        """(outer pid, session, fence) of every writer child alive on the machine now.

        A writer forking its hostile part is seen twice until the fork execs (the fork shares the
        writer's argv and environ): a writer child whose parent is one is that writer, not a second
        tree of its fence."""
        alive: dict[int, tuple[int, str, int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                if argv[1:2] != [self.child_script]:
                    continue  # a `holdfast run` or nsenter naming the child in its CMD is not the child
                stat = (entry / "stat").read_text()
                state, ppid = stat[stat.rfind(")") + 2:].split()[:2]
                if state in "ZX":
                    continue  # a zombie holds no lock and runs nothing
                pairs = (entry / "environ").read_text().split("\0")
                env = dict(kv.split("=", 1) for kv in pairs if "=" in kv)
            except OSError:
                continue
            fence = int(env.get("HOLDFAST_FENCE", "0"))
            alive[int(entry.name)] = (int(ppid), env.get("HOLDFAST_SESSION", "-"), fence)
        return [(pid, session, fence) for pid, (ppid, session, fence) in alive.items() if ppid not in alive]

    def run_pids(self) -> list[int]:
        pids = []
        for run in self.launched:
            if run.proc.poll() is None and run.kind != "skip-gate":
                pids += descendants(run.proc.pid)[:1]
        return pids

    def inject(self, kind: str) -> None:
        c, rng = self.cluster, self.rng
        pause = rng.uniform(0.5, 3.0)
        if kind in ("kill-child", "pause-child", "pid-reuse"):
            kids = self.children_alive()
            if not kids:
                return
            pid, _, _ = rng.choice(kids)
            if kind == "pause-child":
                self._pause_for(pid, pause)
            else:
                host_pid = self.host_pid_of(pid)
                host = self._host_of(pid)
                _kill(pid)
                if kind == "pid-reuse" and host is not None and host_pid:
                    self.reuse_pid(host, host_pid)
        elif kind in ("kill-run", "pause-run"):
            pids = self.run_pids()
            if not pids:
                return
            pid = rng.choice(pids)
            self._pause_for(pid, pause) if kind == "pause-run" else _kill(pid)
        elif kind in ("kill-agent", "pause-agent", "reboot-host"):
            hosts = self.live_hosts()
            if not hosts:
                return
            host = rng.choice(hosts)
            agent = c.running_agent(host)
            if kind == "reboot-host":
                c.reboot(host)
            elif agent is None:
                return  # powered off by a fence meanwhile: no agent to pause or kill
            elif kind == "pause-agent":
                self._pause_for(agent, pause, host.host_id)
            else:
                _kill(agent)  # the reaper exits with its agent: the host goes down
                time.sleep(pause)
                c.reboot(host)
        elif kind in ("kill-coordinator", "pause-coordinator"):
            coordinator = rng.choice(c.coordinators)
            if coordinator.process is None:
                return
            if kind == "pause-coordinator":
                self._pause_for(coordinator.process.pid, pause)
            else:
                _kill(coordinator.process.pid)
                coordinator.process.wait(5)
                time.sleep(pause)
                coordinator.start(30)
        elif kind in ("kill-etcd-member", "kill-etcd-leader"):
            i = c.leader() if kind == "kill-etcd-leader" else rng.randrange(3)
            if i is None or c.etcd[i].process is None:
                return
            _kill(c.etcd[i].process.pid)
            c.etcd[i].process.wait(5)
            time.sleep(pause)
            c.restart_etcd(i)
        elif kind == "cut-probe-link":
            # No answer of that agent can reach a coordinator in the window: any probe evidence
            # timed inside it was not that agent's (the same check as a SIGSTOPped agent's).
            i = rng.randrange(len(c.probe_links))
            c.proxies.cut(c.probe_links[i])
            start_ms = time.time_ns() // 1_000_000 + PAUSE_MARGIN_MS
            time.sleep(pause)
            self.agent_silences.append((c.hosts[i].host_id, start_ms, time.time_ns() // 1_000_000))
            c.proxies.heal(c.probe_links[i])
        elif kind in ("cut-agent-link", "cut-coordinator", "degrade-etcd"):
            proxy = rng.choice({"cut-agent-link": c.agent_links, "cut-coordinator": c.coordinator_proxies,
                                "degrade-etcd": c.etcd_proxies}[kind])
            if kind == "degrade-etcd":
                c.proxies.degrade(proxy, delay=rng.uniform(0.01, 0.2), drop=rng.uniform(0.0, 0.05))
            else:
                c.proxies.cut(proxy)
            time.sleep(pause)
            c.proxies.heal(proxy)
        elif kind == LOSE_HOST:
            hosts = self.live_hosts()
            if not hosts:
                return
            self.ops[f"lose-host-{self._lose_host(rng.choice(hosts), rng.random() < 0.5)}"] += 1
        elif kind == "kill-before-commit":
            self._kill_before_commit()
        elif kind == "rogue-force":
            self.ops[f"rogue-force-{asyncio.run(self._rogue_force())}"] += 1
        elif kind == "archive":
            self.ops[f"archive-{self._archive()}"] += 1
        elif kind == "rogue-tenant":
            self.ops[f"rogue-tenant-{asyncio.run(self.rogue_tenant())}"] += 1
        self.faults[kind] += 1

    def _lose_host(self, host: SimulatedHost, whole: bool) -> str:
        """A host lost whole (its PID namespace killed: power gone) or cut off (its link to the
        coordinator cut: the registration lapses, its processes stay alive and keep writing until a
        fence ends them). Waits until a fence of it is proven or LOST_FOR_S passed (no session names
        it: nothing to fence), then heals the link and boots what is down as a new incarnation."""
        c, i = self.cluster, self.cluster.hosts.index(host)
        since_ms = time.time_ns() // 1_000_000
        if whole:
            _kill(host.reaper_pid)
        else:
            c.proxies.cut(c.agent_links[i])
        deadline = time.monotonic() + LOST_FOR_S
        fenced = False
        while not fenced and time.monotonic() < deadline:
            time.sleep(0.2)
            fenced = self._fenced_since(host.host_id, since_ms)
        if not whole:
            c.proxies.heal(c.agent_links[i])
        if not host.running:
            c.reboot(host)
        return f"{'whole' if whole else 'cut-off'}-{'fenced' if fenced else 'unfenced'}"

    def power_on_fenced(self) -> None:
        """A host a fence powered off (its namespace killed; every other fault boots what it downs)
        is powered on again, as a new incarnation, as an operator would once it was proven off."""
        for host in self.cluster.hosts:
            if not host.running:
                self.cluster.reboot(host)
                self.ops["fenced-host-powered-on"] += 1

    def _fenced_since(self, host_id: str, since_ms: int) -> bool:
        """A proof of `host_id` that an attempt begun after `since_ms` recorded."""
        # Not through the fault proxies, nor a seeded choice: polling must not shift the seed's draws.
        with self.cluster.channel(self.cluster.coordinators[0].address) as channel:
            try:
                states = coordinator_pb2_grpc.CoordinatorStub(channel).ListHosts(
                    pb.ListHostsRequest(), timeout=5).fence_states
            except grpc.RpcError:
                return False  # that replica is down or cut: the next look asks again
        return any(s.host_id == host_id and s.state == "fenced" and s.attempt.started_at_unix_ms >= since_ms
                   for s in states)

    async def _rogue_force(self) -> str:
        """A forced Acquire by a caller that requested no handoff (any client could send one): it
        must be refused before anything is signalled, unless the session needs no kill at all."""
        hosts = self.live_hosts()
        if not hosts:
            return "no-host"
        host, session = self.rng.choice(hosts), self.rng.choice(self.session_ids())
        async with Client(self.cluster.coordinator_address(0), host_id=host.host_id,
                          tls_dir=self.cluster.pki) as client:
            try:
                grant, _ = await client.acquire(session, os.urandom(16).hex(), force=True, takeover=True)
            except ClientError as err:
                return err.reason
            with contextlib.suppress(ClientError):
                await client.release(grant)  # a reservation; nothing was killed for it (free session)
            return "granted"

    async def rogue_tenant(self) -> str:
        """A forced takeover by another tenant's runtime (`pki/rogue`) of a session the workload
        made: refused WRONG_TENANT every time, before anything is asked or signalled. Only ids with a
        record are tried: a fresh id would become the rogue tenant's, as any id becomes its first
        acquirer's."""
        pki, hosts = self.cluster.pki, self.live_hosts()
        if pki is None or not hosts:
            return "no-tls" if pki is None else "no-host"
        made = [s for s in self.session_ids() if s in self._recorded()]
        if not made:
            return "no-session"
        async with Client(self.cluster.coordinator_address(self.rng.randrange(2)),
                          host_id=self.rng.choice(hosts).host_id, tls_dir=pki / "rogue") as client:
            try:
                await client.acquire(self.rng.choice(made), os.urandom(16).hex(), force=True, takeover=True)
            except ClientError as err:
                return str(err.reason)
        return "granted"

    def _recorded(self) -> set[str]:
        with self.cluster.channel(self.cluster.coordinator_address(1)) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            try:
                listed = stub.ListSessions(pb.ListSessionsRequest(), timeout=5).records
                return {r.session_id for r in listed}
            except grpc.RpcError:
                return set()

    def _archive(self) -> str:
        """Archive a session at its current fence (refused while owned), so the next run revives it."""
        session = self.rng.choice(self.session_ids())
        channel = self.cluster.channel(self.cluster.coordinator_address(1))
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            record = stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=5).record
            request = pb.ArchiveSessionRequest(session_id=session, expected_fence=record.lease.fence,
                                               operator="soak", reason="archive churn")
            stub.ArchiveSession(request, timeout=10)
            self.archived.append((session, time.time_ns()))
        except grpc.RpcError as exc:
            return exc.code().name.lower()  # type: ignore[attr-defined, no-any-return]
        finally:
            channel.close()
        return "archived"

    def _pause_for(self, pid: int, seconds: float, agent_of: str = "") -> None:
        with contextlib.suppress(ProcessLookupError):
            self.cluster.pause(pid)
            # The window an agent surely could not answer in: after SIGSTOP landed, before SIGCONT.
            start_ms = time.time_ns() // 1_000_000 + PAUSE_MARGIN_MS
            time.sleep(seconds)
            if agent_of:
                self.agent_silences.append((agent_of, start_ms, time.time_ns() // 1_000_000))
        self.cluster.resume(pid)

    def fences_started(self, session: str) -> list[int]:
        log = self.session_log(session)
        lines = log.read_text().splitlines() if log.exists() else []
        return [int(line.split()[2]) for line in lines if line.startswith("start ")]

    @staticmethod
    def host_pid_of(outer_pid: int) -> int:
        """The pid inside its simulated host (what its agent reports); 0 once it is gone."""
        try:
            return ns_pid(outer_pid)
        except (OSError, LookupError):
            return 0

    def _host_of(self, outer_pid: int) -> SimulatedHost | None:
        for host in self.live_hosts():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{outer_pid}/ns/pid") == os.readlink(f"/proc/{host.reaper_pid}/ns/pid"):
                    return host
        return None

    def reuse_pid(self, host: SimulatedHost, host_pid: int) -> None:
        """A new process lands on the dead owner's pid inside its host (ns_last_pid)."""
        proc = host.spawn([sys.executable, "-c", REUSE, str(host_pid), "not-a-token"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.launched.append(Launched(host, proc, "-", "skip-gate"))  # ended at cleanup like the rest

    def _kill_before_commit(self) -> None:
        """A parent killed between Acquire and commit: its CMD (touch MARKER) must never run."""
        hosts = self.live_hosts()
        if not hosts:
            return
        host, session = self.rng.choice(hosts), self.rng.choice(self.session_ids())
        marker = self.tmp / f"uncommitted-{len(self.launched)}-{session}"
        proc = host.spawn([sys.executable, "-c", RESERVER, session, str(marker)], env=self.env(host),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.launched.append(Launched(host, proc, session, "reserver"))
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 5.0)  # Acquire answered: it printed its fence
        for pid in [*descendants(proc.pid)[:1]]:
            _kill(pid)  # the reserver itself (inside nsenter), whether or not Acquire answered yet
        if ready:
            self.ops["reserved-then-killed"] += 1

    # --- the run ----------------------------------------------------------------------------
    def _sample(self) -> None:
        channel = self.cluster.channel(self.cluster.coordinators[0].address)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        for n in itertools.count():
            if self._sampling.is_set():
                return
            alive = frozenset((s, f, pid) for pid, s, f in self.children_alive())
            self.samples.append((time.time_ns(), alive))
            if n % 10 == 0:
                self._sample_evidence(stub)
            time.sleep(0.05)

    def _sample_evidence(self, stub: coordinator_pb2_grpc.CoordinatorStub) -> None:
        """Each grant's recorded death evidence, read while that grant is current."""
        for session in self.session_ids():
            try:
                lease = stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=1).record.lease
            except grpc.RpcError:
                continue  # not created yet, or the replica is down: the next sample tries again
            if lease.death_evidence.kind:
                self.evidence.setdefault((session, lease.fence), lease.death_evidence)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Samples the process table and grant evidence while the body runs; then heals every fault
        and ends every run, so the history is complete when it returns."""
        sampler = threading.Thread(target=self._sample, daemon=True)
        sampler.start()
        try:
            yield
            self.cluster.heal_all()
            time.sleep(2.0)
            self.end_all()
        finally:
            self._sampling.set()
            sampler.join(5)

    def run(self, max_ops: int, budget_s: float, fault_rate: float = 0.35) -> None:
        deadline = time.monotonic() + budget_s
        with self.recording():
            for n in range(max_ops):
                if time.monotonic() > deadline:
                    break
                # The broken client's soak launches before any fault: a fault drawn first (a host lost
                # whole) can take its whole budget, leaving no run to catch.
                if self.rng.random() < fault_rate and (n or not self.skip_gate):
                    self.inject(self.rng.choice(self.fault_kinds()))
                else:
                    self.launch_run()
                self.reap()
                self.power_on_fenced()
                time.sleep(self.rng.uniform(0.1, 0.8))

    def owner_child(self, session: str, timeout: float = 20.0) -> tuple[int, int]:
        """(outer pid, fence) of the session's live writer child, once there is one."""
        return self.owner_child_above(session, 0, timeout)

    def owner_child_above(self, session: str, fence: int, timeout: float = 20.0) -> tuple[int, int]:
        """(outer pid, fence) of a live writer child of the session with a fence above `fence`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = self.fences_started(session)  # logged `start`: it holds the lock, writes next
            kids = [(pid, f) for pid, s, f in self.children_alive()
                    if s == session and f > fence and f in started]
            if kids:
                return max(kids, key=lambda k: k[1])
            time.sleep(0.05)
        raise TimeoutError(f"no child of {session} within {timeout}s")

    def end_all(self) -> None:
        """SIGTERM every run (it ends its tree and releases), then SIGKILL what is left."""
        for run in self.launched:
            if run.proc.poll() is None:
                for pid in descendants(run.proc.pid)[:1]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for run in self.launched:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(max(0.1, deadline - time.monotonic()))
        self.kill_all()

    def kill_all(self) -> None:
        for run in self.launched:
            if run.proc.poll() is None:
                for pid in [*descendants(run.proc.pid), run.proc.pid]:
                    _kill(pid)
                run.proc.wait(10)
        for pid, _, _ in self.children_alive():  # orphans a killed run left behind
            _kill(pid)

    # --- the history ------------------------------------------------------------------------
    def history(self) -> list[Event]:
        timed: list[tuple[int, Event]] = []
        for session in self.session_ids():
            timed += self._log_events(session)
        timed += self._tree_events()
        timed += self._indeterminate_grants(timed)
        for marker in self.tmp.glob("uncommitted-*"):
            session = marker.name.split("-", 2)[2]
            ran = Event(0, "uncommitted-cmd-ran", session, key=marker.name)
            timed.append((marker.stat().st_mtime_ns, ran))
        # Archiving takes a session's fenced data with it (retention ends with the session): a write
        # acknowledged before an archive of its session is not expected at the end.
        timed = [(t, e) for t, e in timed
                 if e.kind != "put-ack" or not any(s == e.session and t < at for s, at in self.archived)]
        acked = [e for _, e in timed if e.kind == "put-ack"]
        present = asyncio.run(self._present(acked))
        timed += [(time.time_ns(), Event(0, "final-key", e.session, key=e.key)) for e in present]
        timed.sort(key=lambda te: te[0])
        return [Event(n, e.kind, e.session, e.fence, e.host, e.key) for n, (_, e) in enumerate(timed, 1)]

    def _log_events(self, session: str) -> list[tuple[int, Event]]:
        path = self.session_log(session)
        lines = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
        starts: list[tuple[int, int]] = []  # (time, fence) of every child start: the grants it proves
        out: list[tuple[int, Event]] = []
        sends: dict[str, int] = {}
        for event, sid, fence_s, host, pid, seq, t_s in lines:
            fence, t = int(fence_s), int(t_s)
            key = f"w/{fence}/{host}/{pid}/{seq}"
            if event == "start":
                starts.append((t, fence))
                out.append((t, Event(0, "grant", sid, fence, host)))
            elif event == "overlap":
                out.append((t, Event(0, "flock-failed", sid, fence, host)))
            elif event == "send":
                sends[key] = t
            elif event == "ack":
                out.append((t, Event(0, "put-ack", sid, fence, host, key)))
                # Sent after a newer fence's child had started, i.e. after that fence's commit.
                if any(st < sends.get(key, t) and f > fence for st, f in starts):
                    out.append((t, Event(0, "put-stale-ack", sid, fence, host, key)))
        return out

    def _indeterminate_grants(self, timed: list[tuple[int, Event]]) -> list[tuple[int, Event]]:
        """Grants whose death evidence is a probe answer timed while that host's agent was stopped:
        the agent could not have answered, so the grant rested on an indeterminate probe."""
        host_of = {(e.session, e.fence): e.host for _, e in timed if e.kind == "grant"}
        out = []
        for (session, fence), ev in self.evidence.items():
            host = host_of.get((session, ev.owner_fence))
            if ev.kind in PROBED and any(h == host and lo <= ev.observed_at_unix_ms <= hi
                                         for h, lo, hi in self.agent_silences):
                out.append((ev.observed_at_unix_ms * 1_000_000,
                            Event(0, "indeterminate-grant", session, fence, host or "", ev.kind)))
        return out

    def _tree_events(self) -> list[tuple[int, Event]]:
        """tree-start/tree-end from the process-table samples: two trees in one sample overlap."""
        out: list[tuple[int, Event]] = []
        before: frozenset[tuple[str, int, int]] = frozenset()
        for t, alive in self.samples:
            out += [(t, Event(0, "tree-end", s, f, str(pid))) for s, f, pid in before - alive]
            out += [(t, Event(0, "tree-start", s, f, str(pid))) for s, f, pid in alive - before]
            before = alive
        return out

    async def _present(self, acked: list[Event]) -> list[Event]:
        present = []
        async with Client(self.cluster.coordinators[0].address, tls_dir=self.cluster.pki) as client:
            for event in acked:
                for _ in range(5):
                    try:
                        if (await client.fenced_get(event.session, event.key)).found:
                            present.append(event)
                        break
                    except ClientError:
                        await asyncio.sleep(0.5)
        return present

    def figures(self, duration: float, violations: int) -> dict[str, object]:
        return {"seed": self.seed, "duration_s": round(duration, 1), "operations": dict(self.ops),
                "faults": dict(self.faults), "acknowledged_writes": sum(1 for _ in self._acks()),
                "grants_with_death_evidence": len(self.evidence), "exit_1_runs": self.exits_1,
                "violations": violations}

    def _acks(self) -> list[str]:
        return [line for s in self.session_ids() if self.session_log(s).exists()
                for line in self.session_log(s).read_text().splitlines() if line.startswith("ack ")]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def dump(figures: dict[str, object]) -> str:
    return json.dumps(figures, sort_keys=True)
