"""A lost host is fenced, then its sessions are freed: real etcd, real coordinators, agents in
simulated hosts (PID namespaces), real `holdfast run` children and a real fence agent program
(standins/fence_simhost, the fence-agents stdin protocol) whose `off` kills the host's namespace.

Every test that frees a session asserts from /proc that no process of the lost host's namespace
exists once the next CMD has started, and that the session's flock was never held twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from holdfast.coordinator import records
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator, snapshot
from tests.integration.lifecycle_helpers import cli
from tests.integration.run_fixtures import Cluster, until
from tests.integration.test_run_sessions import started

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
FENCER = str(Path(__file__).with_name("standins") / "fence_simhost")
TTL = 2            # the agents' registration_ttl
LOSS = 2.0         # the coordinators' host_loss_after
FENCE_TIMEOUT = 3.0


def ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@dataclass
class Fencing:
    """A cluster whose coordinator fences lost hosts with the simulated-host fence agent."""

    cluster: Cluster
    etcd: EtcdServer
    prefix: str
    tmp: Path

    @property
    def log(self) -> Path:
        return self.tmp / "fencer.log"

    @property
    def modes(self) -> Path:
        return self.tmp / "fencer.modes"

    def host(self, host_id: str) -> SimulatedHost:
        host = self.cluster.host(host_id, "--registration-ttl", str(TTL))
        self.mark(host)
        return host

    def mark(self, host: SimulatedHost) -> None:
        """Tells the fencer which PID 1 is this host's (a reboot makes a new one)."""
        reaper = host.reaper_pid
        (self.tmp / f"{host.host_id}.reaper").write_text(f"{reaper} {ticks(reaper)}")

    def runs(self, action: str = "") -> list[list[str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line.split() for line in lines if not action or line.split()[0] == action]

    def agent_pid(self, host: SimulatedHost) -> int:
        return children(host.reaper_pid)[0]  # the reaper's one child is the agent

    def registered(self) -> set[str]:
        return {h.host_id for h in self.cluster.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts}

    def keys(self, kind: str) -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in snapshot(self.etcd.url, self.prefix) if k.startswith(self.prefix + kind)]


def start_ticks(pid: int) -> int | None:
    try:
        return ticks(pid)
    except FileNotFoundError:
        return None


def namespace(host: SimulatedHost) -> frozenset[tuple[int, int]]:
    """Every process of the host's PID namespace now, as (pid, start ticks), read from /proc. Kept
    as processes, not as the namespace's inode: nsfs inodes are reused, and other suites on this
    machine make namespaces all the time."""
    inode = os.stat(f"/proc/{host.reaper_pid}/ns/pid").st_ino
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/pid").st_ino == inode:
                    found.add((int(entry), ticks(int(entry))))
            except OSError:
                continue  # exited while listed
    assert len(found) >= 2, found  # its PID 1 and its agent at least
    return frozenset(found)


def in_namespace(members: frozenset[tuple[int, int]]) -> list[int]:
    """Those of `members` that still exist (the same pid, started at the same tick)."""
    return [pid for pid, start in members if start_ticks(pid) == start]


def fencer_settings(tmp: Path) -> str:
    return json.dumps([{"hosts": "fh-*", "program": FENCER,
                        "options": {"plug": "{host}", "hosts_dir": str(tmp), "log": str(tmp / "fencer.log"),
                                    "mode_file": str(tmp / "fencer.modes")}}])


def coordinator_args(tmp: Path, loss: float = LOSS) -> tuple[str, ...]:
    return ("--fencers", fencer_settings(tmp), "--host-loss-after", str(loss), "--fence-timeout",
            str(FENCE_TIMEOUT), "--fence-retry-seconds", "0.3", "--metrics-listen", "127.0.0.1:0")


def fenced_cluster(etcd: EtcdServer, tmp: Path, prefix: str, loss: float) -> Iterator[Fencing]:
    coordinator = Coordinator(etcd.url, tmp, prefix, args=coordinator_args(tmp, loss)).start()
    cluster = Cluster(coordinator, tmp)
    try:
        yield Fencing(cluster, etcd, prefix, tmp)
    finally:
        cluster.stop()
        coordinator.stop()


@pytest.fixture
def fencing(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Fencing]:
    yield from fenced_cluster(etcd, tmp_path, prefix, LOSS)


@pytest.fixture
def by_hand(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Fencing]:
    """Lost hosts are fenced only by an operator: host_loss_after is an hour."""
    yield from fenced_cluster(etcd, tmp_path, prefix, 3600)


def metric(address: str, name: str, **labels: str) -> float:
    """The sample of `name` with these labels on a coordinator's /metrics, 0 when there is none."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def assert_fenced_then_granted(fencing: Fencing, sid: str, lost: frozenset[tuple[int, int]],
                               fence: int = 2) -> list[str]:
    """The waiter's CMD started at `fence`, after the fence's proof; then no process of the lost
    namespace exists, the flock was never held twice, and the evidence is `host-fenced`."""
    c = fencing.cluster
    start = started(c, fence, timeout=60)
    assert in_namespace(lost) == []
    assert c.events("overlap") == []
    offs, statuses = fencing.runs("off"), fencing.runs("status")
    assert len(offs) == 1 and len(statuses) == 1
    assert int(statuses[0][3]) < int(start[4])  # the proof's status ran before the next CMD started
    got = c.record(sid)
    evidence = got.record.lease.death_evidence
    assert evidence.kind == "host-fenced", evidence
    assert FENCER in evidence.detail and "Status: OFF" in evidence.detail
    assert "host-fenced" in [h.transition for h in got.history]
    return start


def test_a_lost_host_is_fenced_and_its_waiters_granted(fencing: Fencing) -> None:
    c = fencing.cluster
    lost, other, third = fencing.host("fh-lost"), fencing.host("fh-other"), fencing.host("fh-third")
    sid, second = "sess-fence-lost-1", "sess-fence-lost-2"
    c.run(lost, sid)
    c.run(lost, second, cmd=child(c, second))
    until("both owners", lambda: len([e for e in c.events("start") if e[1] == "1"]) == 2, 20)
    c.run(other, sid, "--wait", "120")
    c.run(third, second, "--wait", "120", cmd=child(c, second))
    members = namespace(lost)
    killed = time.monotonic()
    os.kill(lost.reaper_pid, signal.SIGKILL)  # power loss: the whole namespace ends
    assert_fenced_then_granted(fencing, sid, members)
    # One fence freed both; each waiter's CMD runs at the next fence, on its own host.
    until("the second waiter", lambda: len([e for e in c.events("start") if e[1] == "2"]) == 2, 30)
    assert sorted(e[2] for e in c.events("start") if e[1] == "2") == ["fh-other", "fh-third"]
    assert c.record(second).record.lease.death_evidence.kind == "host-fenced"
    assert len(fencing.runs("off")) == 1
    took = time.monotonic() - killed
    print(f"host lost -> next CMD running: {took:.2f}s (registration_ttl {TTL}s, host_loss_after {LOSS}s)")
    assert fencing.runs("off")[0][1] == "fh-lost"
    states = {s.host_id: s for s in c.stub.ListHosts(pb.ListHostsRequest(), timeout=5).fence_states}
    assert states["fh-lost"].state == "fenced" and states["fh-lost"].attempt.answer == "off"


def test_a_cut_off_host_is_fenced_before_its_session_moves(fencing: Fencing) -> None:
    c = fencing.cluster
    cut, other = fencing.host("fh-cut"), fencing.host("fh-other2")
    sid = "sess-fence-cut-1"
    owner = c.run(cut, sid)
    started(c, 1)
    members = namespace(cut)
    os.kill(fencing.agent_pid(cut), signal.SIGSTOP)  # cut off: the agent is silent, CMD runs on
    c.run(other, sid, "--wait", "120")
    assert_fenced_then_granted(fencing, sid, members)
    assert owner.proc.wait(10) != 0  # the old owner's run ended with its host


def test_a_fence_that_proves_nothing_frees_nothing_and_is_retried(fencing: Fencing) -> None:
    c = fencing.cluster
    cut, other = fencing.host("fh-bad"), fencing.host("fh-other3")
    # Attempts 0..4 misbehave; attempt 5 waits for the test, then is a truthful agent.
    go = fencing.tmp / "go"
    fencing.modes.write_text(f"fail\nwrong\non\nhang\nfail\nhold:{go}\n")
    sid = "sess-fence-bad-1"
    c.run(cut, sid)
    started(c, 1)
    members = namespace(cut)
    waiter = c.run(other, sid, "--wait", "150")
    os.kill(fencing.agent_pid(cut), signal.SIGSTOP)
    until("the registration to lapse", lambda: "fh-bad" not in fencing.registered(), 20)
    before = [kv for kv in snapshot(fencing.etcd.url, fencing.prefix)
              if "/fence-history/" not in kv[0] and "/fence-pending/" not in kv[0]]
    until("five unproven attempts, and the sixth held", lambda: len(fencing.runs("off")) == 6, 90)
    # Nothing but the attempts was written: every record, fence and history entry as it was.
    after = [kv for kv in snapshot(fencing.etcd.url, fencing.prefix)
             if "/fence-history/" not in kv[0] and "/fence-pending/" not in kv[0]]
    assert after == before
    attempts = [json.loads(v) for _, v in fencing.keys("fence-history/")]
    answers = [a["answer"] for a in attempts]
    assert answers == ["unknown", "unknown", "on", "unknown", "unknown"], attempts
    assert "off exited 1" in attempts[0]["detail"] and "Success: Powered OFF" in attempts[1]["detail"]
    assert attempts[3]["actions"][0]["timedOut"] is True
    hang_child = int(fencing.runs("hang-child")[0][2])
    assert _state(hang_child) in ("gone", "Z")  # killed with the agent's process group
    attempted = c.coordinator.metrics, "holdfast_fence_attempts_total"
    assert metric(*attempted, host="fh-bad", answer="unknown") >= 4  # the alert's counter
    assert metric(*attempted, host="fh-bad", answer="on") == 1
    assert (fencing.tmp / "coordinator.log").read_text().count('"alert": "fence-failed"') == 5
    assert in_namespace(members)  # nothing killed it: it runs on, unfenced
    assert c.events("start") and all(e[1] == "1" for e in c.events("start"))
    assert waiter.proc.poll() is None
    # The sixth attempt is truthful: only now is the session freed.
    go.write_text("\n")
    start = started(c, 2, timeout=60)
    assert in_namespace(members) == []
    assert c.events("overlap") == []
    assert len(fencing.runs("off")) == 6 and int(fencing.runs("status")[-1][3]) < int(start[4])


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rfind(")") + 2]


def test_an_agent_back_during_the_fence_is_refused_until_the_attempt_ends(fencing: Fencing) -> None:
    c = fencing.cluster
    cut = fencing.host("fh-back")
    go = fencing.tmp / "go"
    # The first attempt waits for the test; it and every retry prove nothing.
    fencing.modes.write_text(f"hold:{go}\n" + "fail\n" * 20)
    sid = "sess-fence-back-1"
    c.run(cut, sid)
    started(c, 1)
    before = c.record(sid).SerializeToString()
    agent = fencing.agent_pid(cut)
    os.kill(agent, signal.SIGSTOP)
    until("the fence to begin", lambda: fencing.runs("off"), 30)
    assert [k for k, _ in fencing.keys("fence-pending/")] == [fencing.prefix + "fence-pending/fh-back"]
    os.kill(agent, signal.SIGCONT)  # back, while the device is being asked
    agent_log = fencing.tmp / "fh-back" / "agent-fh-back.log"
    refused = "a fence of this host is running"
    until("the registration's refusal", lambda: refused in agent_log.read_text(), 30)
    assert "fh-back" not in fencing.registered()
    go.write_text("fail\n")  # the attempt ends proving nothing
    until("the agent to register again", lambda: "fh-back" in fencing.registered(), 30)
    assert fencing.keys("fence-pending/") == []
    assert c.record(sid).SerializeToString() == before  # nothing freed: the owner runs on
    assert {json.loads(v)["answer"] for _, v in fencing.keys("fence-history/")} == {"unknown"}
    assert len(fencing.runs("status")) == 0


def test_two_replicas_run_one_fence(fencing: Fencing) -> None:
    c = fencing.cluster
    second = Coordinator(fencing.etcd.url, fencing.tmp / "second", fencing.prefix,
                         args=coordinator_args(fencing.tmp))
    (fencing.tmp / "second").mkdir()
    second.start()
    try:
        lost, other = fencing.host("fh-two"), fencing.host("fh-other5")
        go = fencing.tmp / "go"
        fencing.modes.write_text(f"hold:{go}\n")
        sid = "sess-fence-two-1"
        c.run(lost, sid)
        started(c, 1)
        members = namespace(lost)
        c.run(other, sid, "--wait", "120")
        os.kill(lost.reaper_pid, signal.SIGKILL)
        until("the fence to begin", lambda: fencing.runs("off"), 30)
        # One replica runs the agent; the other has tried to begin a fence meanwhile, and lost.
        logs = [fencing.tmp / "coordinator.log", fencing.tmp / "second" / "coordinator.log"]
        ran, lost = "fencing host fh-two", "fence of this host is already running"

        def each_tried() -> bool:
            said = sorted((ran in log.read_text(), lost in log.read_text()) for log in logs)
            return said == [(False, True), (True, False)]

        until("the other replica's try", each_tried, 30)
        go.write_text("\n")
        assert_fenced_then_granted(fencing, sid, members)
    finally:
        second.stop()


def test_a_host_rebooted_before_the_proof_keeps_its_new_owners(fencing: Fencing) -> None:
    c = fencing.cluster
    lost, other = fencing.host("fh-boot"), fencing.host("fh-other6")
    go = fencing.tmp / "go"
    fencing.modes.write_text(f"hold:{go}\n")  # the first attempt waits; every later one is truthful
    old_sid, new_sid, later_sid = "sess-fence-old-1", "sess-fence-new-1", "sess-fence-later-1"
    c.run(lost, old_sid, cmd=child(c, old_sid))
    until("the old owner", lambda: any(e[1] == "1" for e in c.events("start")), 20)
    os.kill(lost.reaper_pid, signal.SIGKILL)
    until("the fence to begin", lambda: fencing.runs("off"), 30)
    lost.start()  # rebooted while the device is asked: its agent is refused until the attempt ends
    assert "fh-boot" not in fencing.registered()
    go.write_text("\n")  # the device answers for the old boot: Already OFF, then Status: OFF
    until("the old owner freed", lambda: c.record(old_sid).record.lease.claim_status == pb.RELEASED, 30)
    until("the new incarnation registered", lambda: "fh-boot" in fencing.registered(), 30)
    fencing.mark(lost)
    c.run(lost, new_sid, cmd=child(c, new_sid))
    until("the new incarnation's owner", lambda: owned(c, new_sid), 30)
    before = c.record(new_sid).SerializeToString()
    # Another host lost later: every pass until its fence (and the one that fences it) ran with the
    # old proof and the new owner both recorded, and left that owner alone.
    c.run(other, later_sid, cmd=child(c, later_sid))
    until("the later owner", lambda: owned(c, later_sid), 30)
    os.kill(other.reaper_pid, signal.SIGKILL)
    until("the later host freed", lambda: c.record(later_sid).record.lease.claim_status == pb.RELEASED, 60)
    assert c.record(new_sid).SerializeToString() == before
    assert c.record(old_sid).record.lease.death_evidence.kind == "host-fenced"


def owned(c: Cluster, session: str) -> bool:
    """The session has a committed owner (False while it has no record yet)."""
    try:
        return c.record(session).record.lease.claim_status in (pb.COMMITTED, pb.LIVE)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
            raise
        return False


def child(c: Cluster, session: str) -> list[str]:
    """The overlap child with a lock of this session's own (sessions do not exclude each other)."""
    return [sys.executable, str(Path(__file__).with_name("run_child.py")), str(c.tmp / f"{session}.lock"),
            str(c.tmp / "session.log")]


def test_the_incarnation_proven_off_is_refused_loudly_when_it_registers_again(fencing: Fencing) -> None:
    c = fencing.cluster
    liar = fencing.host("fh-liar")
    fencing.modes.write_text("lie\n")  # the device says OFF and powered nothing off
    sid = "sess-fence-lie-1"
    c.run(liar, sid)
    started(c, 1)
    agent = fencing.agent_pid(liar)
    os.kill(agent, signal.SIGSTOP)
    until("the lying proof", lambda: c.record(sid).record.lease.claim_status == pb.RELEASED, 30)
    os.kill(agent, signal.SIGCONT)
    agent_log = fencing.tmp / "fh-liar" / "agent-fh-liar.log"
    until("the loud refusal", lambda: "the fence device lied" in agent_log.read_text(), 30)
    assert "fh-liar" not in fencing.registered()
    refusals = c.coordinator.metrics, "holdfast_refusals_total"
    assert metric(*refusals, rpc="RegisterHost", reason="HOST_FENCED") >= 1
    assert '"alert": "fenced-host-alive"' in (fencing.tmp / "coordinator.log").read_text()
    code, out = cli(c.coordinator.address, "hosts")
    assert code == 0 and [(f["host_id"], f["state"]) for f in out["fencing"]] == [("fh-liar", "fenced")], out
    # The node's own doctor says so too.
    doctor = liar.spawn([sys.executable, "-m", "holdfast.cli", "agent", "doctor", "--json", "--coordinator",
                         c.coordinator.address, "--host-id", "fh-liar"], stdout=subprocess.PIPE)
    report, _ = doctor.communicate(timeout=60)
    checks = {check["name"]: check for check in json.loads(report)["checks"]}
    assert doctor.returncode == 1 and checks["fenced"]["status"] == "fail", checks["fenced"]
    assert FENCER in checks["fenced"]["detail"]


def test_an_operator_fences_by_hand(by_hand: Fencing) -> None:
    c = by_hand.cluster
    host = by_hand.host("fh-hand")
    sid = "sess-fence-hand-1"
    c.run(host, sid)
    started(c, 1)
    members = namespace(host)
    code, out = cli(c.coordinator.address, "admin", "fence", "fh-hand", "--reason", "rack on fire")
    assert code == 75 and out["error"]["reason"] == "HOST_LIVE", out  # a registered agent: never
    assert by_hand.runs() == []
    os.kill(by_hand.agent_pid(host), signal.SIGSTOP)
    until("the registration to lapse", lambda: "fh-hand" not in by_hand.registered(), 20)
    code, out = cli(c.coordinator.address, "admin", "fence", "fh-hand", "--reason", "rack on fire")
    assert code == 0, out
    assert out["attempt"]["answer"] == "off" and "rack on fire" in out["attempt"]["requested_by"]
    assert [(r["session_id"], r["recovered"]) for r in out["results"]] == [(sid, True)]
    assert in_namespace(members) == []
    evidence = c.record(sid).record.lease.death_evidence
    assert evidence.kind == "host-fenced" and "rack on fire" in evidence.detail
    hosts = [sys.executable, "-m", "holdfast.cli", "hosts", "--coordinator", c.coordinator.address]
    text = subprocess.run(hosts, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "LOST HOST" in text and "fh-hand" in text and "fenced" in text, text


def test_an_owner_from_before_a_reboot_is_freed_by_the_fence_of_the_boot_after(by_hand: Fencing) -> None:
    """A host rebooted before anyone took its session, then lost that later boot too: with no
    agent left to probe the old owner, the fence of the later boot frees it, because that boot
    proves the earlier one ended and the record was written before the proof. A simulated host
    cannot change its boot id (every namespace shares the kernel's), and a namespace inode given
    back to its next namespace is up to the kernel; so the record is put as a boot before this one
    left it: its owner's incarnation the same machine and namespace, another boot id."""
    c = by_hand.cluster
    host = by_hand.host("fh-older")
    other = by_hand.host("fh-other8")
    sid = "sess-fence-older-1"
    c.run(host, sid)
    started(c, 1)
    record = c.record(sid).record
    current = apb.HostIncarnation()
    current.CopyFrom(record.lease.owner.incarnation)
    record.lease.owner.incarnation.boot_id = "a-boot-before-this-one"
    c.etcd_put(f"sessions/{sid}", records.encode(record))
    members = namespace(host)
    os.kill(by_hand.agent_pid(host), signal.SIGSTOP)  # the later boot is lost as well
    until("the registration to lapse", lambda: "fh-older" not in by_hand.registered(), 20)
    code, out = cli(c.coordinator.address, "admin", "fence", "fh-older", "--reason", "gone again")
    assert code == 0, out
    assert out["attempt"]["answer"] == "off"
    assert out["attempt"]["incarnation"]["boot_id"] == current.boot_id  # the proof is of the later boot
    assert [(r["session_id"], r["recovered"]) for r in out["results"]] == [(sid, True)]
    assert in_namespace(members) == []
    assert c.record(sid).record.lease.death_evidence.kind == "host-fenced"
    c.run(other, sid)
    assert started(c, 2)[2] == "fh-other8"
    assert c.events("overlap") == []


def test_bad_fencer_settings_stop_the_start(etcd: EtcdServer, tmp_path: Path, prefix: str) -> None:
    base = [sys.executable, "-m", "holdfast.cli", "coordinator", "serve", "--etcd", etcd.url, "--listen",
            "127.0.0.1:0", "--prefix", prefix]
    for fencers, says in [
        ('[{"hosts": "h*", "program": "fence_ipmilan"}]', "program must be the fence agent's absolute path"),
        ('[{"hosts": "h1", "program": "/nonexistent/fence_x"}]', "/nonexistent/fence_x (hosts 'h1') is not"),
        ('[{"hosts": "h*", "program": "' + FENCER + '", "options": {"action": "reboot"}}]',
         "set by holdfast itself"),
        ('[{"hosts": "h*", "program": "' + FENCER + '", "options": {"plug": "{host}"}, '
         '"secrets": {"password": "/nonexistent/pw"}}]', "secret file /nonexistent/pw"),
        ('[{"hosts": "h*", "program": "' + FENCER + '", "options": {"ip": "127.0.0.5"}}]',
         "ip, ipaddr holds {host}"),
        ("{oops", "not a JSON list"),
    ]:
        done = subprocess.run([*base, "--fencers", fencers], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr and "fencers" in done.stderr, done.stderr
    done = subprocess.run([*base, "--host-loss-after", "0"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and "host_loss_after" in done.stderr, done.stderr
    # From the TOML file, the message names the file and the key.
    settings = tmp_path / "holdfast.toml"
    settings.write_text('[[coordinator.fencers]]\nhosts = "h*"\nprogram = "/usr/sbin/fence_dummy"\n')
    done = subprocess.run([*base, "--config", str(settings)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and f"{settings} [coordinator] key fencers" in done.stderr, done.stderr
    assert "proves nothing" in done.stderr
