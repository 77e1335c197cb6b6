"""The Kubernetes out-of-service taint as a fencer, against the loopback stand-in API server (a real
kube-apiserver cannot run here): a real coordinator (mTLS, a real etcd on its own CA) serving the
issuer, an agent that enrolled through it (so its certificate carries its Node's uid) and a real
`holdfast run` owning a session on that host. The host is lost (its run and agent killed -9), its
registration lapses, and only the taint on the enrolled Node uid, that the coordinator's first read
of the Node after the lapse did not find, on a Node that is not Ready, frees the session; a taint
added before the lapse (whatever its timeAdded says, a clock ahead of the coordinator's included),
on another uid, removed before the fence reads it, or a deleted Node proves nothing and writes
nothing but the attempt.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from holdfast.common import certs, tls
from holdfast.common.tls import Role
from holdfast.coordinator import fence_rules
from holdfast.coordinator.store import etcd_credentials
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator, snapshot
from tests.integration.k8s_standin import KubeStandIn
from tests.integration.run_fixtures import until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.k8s_standin"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")]
NODE = "node-1"
LOSS = 4.0  # host_loss_after: room to add (or remove) a taint between the lapse and the fence
UNWRITTEN = ("/hosts/", "/fence-pending/", "/fence-history/")  # what a lost host's attempts may change


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki")) / "ca"
    certs.init_local(base, [], ["127.0.0.1", "localhost"])
    return base


@dataclass
class Lost:
    """A coordinator fencing node-* by the taint, an enrolled agent of node-1 and a run it owns."""

    coordinator: Coordinator
    kube: KubeStandIn
    etcd: EtcdServer
    prefix: str
    pki: Path
    tmp: Path
    agent: AgentProcess | None = None
    run: subprocess.Popen[bytes] | None = None
    channel: grpc.Channel | None = None

    def stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        if self.channel is None:
            self.channel = tls.open_channel(self.coordinator.address, self.pki, Role("operator"), sync=True)
        return coordinator_pb2_grpc.CoordinatorStub(self.channel)

    def record(self, sid: str) -> pb.GetSessionResponse:
        return self.stub().GetSession(pb.GetSessionRequest(session_id=sid), timeout=5)  # type: ignore[no-any-return]

    def state(self) -> pb.HostFenceState | None:
        states = self.stub().ListHosts(pb.ListHostsRequest(), timeout=5).fence_states
        return next((s for s in states if s.host_id == NODE), None)

    def registered(self) -> bool:
        return any(h.host_id == NODE for h in self.stub().ListHosts(pb.ListHostsRequest(), timeout=5).hosts)

    def etcd_keys(self) -> list[tuple[str, bytes]]:
        return snapshot(self.etcd.url, self.prefix, etcd_credentials(self.etcd.url, self.pki / "etcd"))

    def written(self) -> list[tuple[str, bytes]]:
        return [kv for kv in self.etcd_keys() if not any(part in kv[0] for part in UNWRITTEN)]

    def own(self, sid: str) -> None:
        """`holdfast run` on node-1 owning `sid` (its CMD sleeps)."""
        env = {**os.environ, "HOLDFAST_HOST_ID": NODE, "HOLDFAST_COORDINATOR": self.coordinator.address,
               "HOLDFAST_TLS_DIR": str(self.pki), "TMPDIR": str(self.tmp),
               "XDG_STATE_HOME": str(self.tmp / "state")}
        self.run = subprocess.Popen([sys.executable, "-m", "holdfast.cli", "run", "--session", sid, "--",
                                     "sleep", "600"], env=env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=open(self.tmp / "run.err", "ab"))  # noqa: SIM115
        until("the run to own the session", lambda: self._owned(sid), 30)

    def _owned(self, sid: str) -> bool:
        try:
            lease = self.record(sid).record.lease
        except Exception:  # not created yet
            return False
        return lease.claim_status in (pb.COMMITTED, pb.LIVE) and lease.owner.host_id == NODE

    def lose(self, sid: str) -> None:
        """The host gone (its run, its CMD and its agent killed -9), once the coordinator has seen
        its registration absent and read its Node since (the read a later taint is judged against)."""
        assert self.run is not None and self.agent is not None
        reads = self.kube.state.node_reads
        cmd = self.record(sid).record.lease.owner.pid  # in its own process group, as the gate put it
        os.killpg(self.run.pid, signal.SIGKILL)
        self.run.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(cmd, signal.SIGKILL)
        self.agent.proc.kill()
        self.agent.proc.wait(10)
        until("the registration to lapse", lambda: not self.registered(), 20)
        until("the coordinator to see it absent", lambda: (s := self.state()) is not None
              and s.absent_since_unix_ms, 10)
        until("the coordinator's first read of the Node since",
              lambda: self.kube.state.node_reads > reads, 10)


def rfc3339(ahead_s: float = 0.0) -> str:
    """A taint's timeAdded as the API server writes it (whole seconds, UTC), by a clock `ahead_s`
    ahead of this machine's."""
    added = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=ahead_s)
    return added.strftime("%Y-%m-%dT%H:%M:%SZ")


def taint(kube: KubeStandIn, ready: str = "Unknown", added: str = "") -> None:
    """`kubectl taint nodes node-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, on a
    Node whose kubelet stopped reporting (the node controller set Ready Unknown)."""
    node = kube.state.nodes[NODE]
    node["spec"]["taints"] = [{"key": fence_rules.OUT_OF_SERVICE, "value": "nodeshutdown",
                               "effect": "NoExecute", "timeAdded": added or rfc3339()}]
    node["status"]["conditions"] = [{"type": "Ready", "status": ready}]


@pytest.fixture
def lost(tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path, kube: KubeStandIn) -> Iterator[Lost]:
    fencers = [{"hosts": "node-*", "kind": fence_rules.KUBERNETES,
                "options": {"api_server": kube.url, "api_ca": str(kube.ca_file),
                            "api_token_file": str(kube.issuer_token_file)}}]
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki), "--enroll-listen", "127.0.0.1:0", "--enroll-api-server", kube.url,
        "--enroll-api-ca", str(kube.ca_file), "--enroll-api-token-file", str(kube.issuer_token_file),
        "--enroll-namespace", "holdfast", "--fencers", json.dumps(fencers), "--host-loss-after", str(LOSS),
        "--fence-timeout", "5", "--fence-retry-seconds", "0.3")).start()
    kube.add_node(NODE)
    pod = kube.add_pod("holdfast", "holdfast-agent-node-1", NODE)
    token_file = tmp_path / "token"
    token_file.write_text(kube.token(pod, with_node=True))
    state = Lost(coordinator, kube, tls_etcd, prefix, pki, tmp_path)
    try:
        state.agent = AgentProcess(tmp_path, NODE, args=[
            "--tls-dir", str(tmp_path / "agent-tls"), "--enroll", coordinator.enroll, "--enroll-ca",
            str(pki / "ca.pem"), "--token-file", str(token_file), "--coordinator", coordinator.address,
            "--registration-ttl", "2"])
        until("node-1 registered", state.registered, 20)
        yield state
    finally:
        if state.run is not None and state.run.poll() is None:
            os.killpg(state.run.pid, signal.SIGKILL)
            state.run.wait(10)
        if state.agent is not None:
            state.agent.stop()
        if state.channel is not None:
            state.channel.close()
        coordinator.stop()


def test_the_registration_keeps_the_enrolled_node_uid_without_a_lease(lost: Lost) -> None:
    uid = lost.kube.state.nodes[NODE]["metadata"]["uid"]
    last = [v for k, v in lost.etcd_keys() if k.endswith(f"/host-last/{NODE}")]
    assert len(last) == 1 and json.loads(last[0])["nodeUid"] == uid


def test_a_taint_on_the_enrolled_node_after_the_lapse_frees_the_session(lost: Lost) -> None:
    sid = "sess-kube-taint-1"
    lost.own(sid)
    uid = lost.kube.state.nodes[NODE]["metadata"]["uid"]
    lost.lose(sid)
    taint(lost.kube)
    until("the proof", lambda: (s := lost.state()) is not None and s.state == "fenced", 30)
    got = until("the session freed", lambda: (r := lost.record(sid)).record.lease.death_evidence.kind
                == "host-fenced" and r, 20)
    assert isinstance(got, pb.GetSessionResponse)
    evidence = got.record.lease.death_evidence
    assert fence_rules.KUBE_PROGRAM in evidence.detail, evidence.detail
    assert f"taint {fence_rules.OUT_OF_SERVICE}=nodeshutdown:NoExecute added" in evidence.detail
    assert f"Node {NODE} uid {uid}" in evidence.detail
    assert "host-fenced" in [h.transition for h in got.history]
    assert [k for k, _ in lost.etcd_keys() if k.endswith(f"/fenced/{NODE}")]


def _before_the_lapse(lost: Lost) -> None:
    taint(lost.kube)  # while its agent still heartbeats: a declaration about some earlier loss


def _before_the_lapse_by_a_clock_ahead(lost: Lost) -> None:
    # A leftover taint stamped an hour ahead of the coordinator's clock (the API server's runs
    # ahead, or the coordinator's behind): a rule comparing timeAdded with the lapse's wall-clock
    # time took it as this loss's proof.
    taint(lost.kube, added=rfc3339(ahead_s=3600))


def _on_another_uid(lost: Lost) -> None:
    lost.kube.add_node(NODE)  # deleted and created again: kubelet's new Node, a new uid
    taint(lost.kube)


def _removed_before_the_read(lost: Lost) -> None:
    taint(lost.kube)
    lost.kube.state.nodes[NODE]["spec"]["taints"] = []


def _deleted(lost: Lost) -> None:
    del lost.kube.state.nodes[NODE]


@pytest.mark.parametrize(("before", "after", "says"), [
    (_before_the_lapse, None, "was already there when this replica read the Node"),
    (_before_the_lapse_by_a_clock_ahead, None, "was already there when this replica read the Node"),
    (None, _on_another_uid, "another machine took the name"),
    (None, _removed_before_the_read, f"has no {fence_rules.OUT_OF_SERVICE} taint"),
    (None, _deleted, "a deleted Node is not proof"),
])
def test_a_taint_that_proves_nothing_writes_nothing(lost: Lost, before: Callable[[Lost], None] | None,
                                                    after: Callable[[Lost], None] | None, says: str) -> None:
    sid = "sess-kube-taint-none"
    lost.own(sid)
    if before is not None:
        before(lost)
    lost.lose(sid)
    written = lost.written()
    if after is not None:
        after(lost)
    state = until("an attempt that proves nothing", lambda: (s := lost.state()) is not None
                  and s.state == "failed" and s, 30)
    assert isinstance(state, pb.HostFenceState)
    assert state.attempt.answer == "unknown" and says in state.attempt.detail, state.attempt.detail
    assert state.attempt.program == fence_rules.KUBE_PROGRAM
    assert lost.written() == written  # every record, fence, history entry and proof as it was
    assert not [k for k, _ in lost.etcd_keys() if k.endswith(f"/fenced/{NODE}")]
    assert lost.record(sid).record.lease.claim_status in (pb.COMMITTED, pb.LIVE)


def test_a_leftover_taint_removed_and_added_again_after_the_lapse_frees_the_session(lost: Lost) -> None:
    sid = "sess-kube-taint-again"
    lost.own(sid)
    taint(lost.kube, added="2026-01-01T00:00:00Z")  # left from an earlier outage
    lost.lose(sid)
    lost.kube.state.nodes[NODE]["spec"]["taints"] = []
    taint(lost.kube, added="2026-01-01T00:00:01Z")  # this loss's: a new addition, whatever its time
    until("the proof", lambda: (s := lost.state()) is not None and s.state == "fenced", 30)
    until("the session freed", lambda: lost.record(sid).record.lease.death_evidence.kind == "host-fenced", 20)
