"""Enrollment through the real commands: `coordinator serve --enroll-listen` and `agent serve --enroll`.

A coordinator process (mTLS, a real etcd on its own CA) serves the issuer against the stand-in API
server; an agent process with an empty TLS directory and its pod's token enrolls, serves and
registers as its node; its enrolled certificate, presented over the wire, cannot register another
host id (WRONG_ROLE, nothing written); and an agent whose pod is gone does not start (exit 77).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.common import certs, tls
from holdfast.common.reasons import reason_of
from holdfast.common.tls import Role
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


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki")) / "ca"
    certs.init_local(base, [], ["127.0.0.1", "localhost"])
    return base


@pytest.fixture
def issuing_coordinator(tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path,
                        kube: KubeStandIn) -> Iterator[Coordinator]:
    server = Coordinator(tls_etcd.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki), "--enroll-listen", "127.0.0.1:0", "--enroll-api-server", kube.url,
        "--enroll-api-ca", str(kube.ca_file), "--enroll-api-token-file", str(kube.issuer_token_file),
        "--enroll-namespace", "holdfast")).start()
    try:
        yield server
    finally:
        server.stop()


def enroll_args(coordinator: Coordinator, pki: Path, agent_dir: Path, token_file: Path) -> list[str]:
    return ["--tls-dir", str(agent_dir), "--enroll", coordinator.enroll, "--enroll-ca", str(pki / "ca.pem"),
            "--token-file", str(token_file), "--coordinator", coordinator.address]


def test_an_agent_enrolls_serves_and_registers_only_its_own_node(
        issuing_coordinator: Coordinator, kube: KubeStandIn, pki: Path, tmp_path: Path, tls_etcd: EtcdServer,
        prefix: str) -> None:
    kube.add_node("node-1")
    pod = kube.add_pod("holdfast", "holdfast-agent-node-1", "node-1")
    token_file = tmp_path / "token"
    token_file.write_text(kube.token(pod, with_node=True))
    agent_dir = tmp_path / "agent-tls"
    assert issuing_coordinator.enroll
    args = enroll_args(issuing_coordinator, pki, agent_dir, token_file)
    agent = AgentProcess(tmp_path, "node-1", args=args)
    try:
        assert (agent_dir / "agent-node-1.key").stat().st_mode & 0o777 == 0o600
        with tls.open_channel(issuing_coordinator.address, pki, Role("client"), sync=True) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            until("registration of node-1", lambda: any(
                h.host_id == "node-1" for h in stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts))
        before = snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd"))
        # The enrolled certificate, over the wire, for another host id.
        with tls.open_channel(issuing_coordinator.address, agent_dir, Role("agent", "node-1"),
                              sync=True) as channel:
            registration = pb.HostRegistration(host_id="node-2", address="127.0.0.1:1")
            with pytest.raises(grpc.RpcError) as refused:
                coordinator_pb2_grpc.CoordinatorStub(channel).RegisterHost(
                    pb.RegisterHostRequest(registration=registration, ttl_seconds=10), timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert reason_of(refused.value) == "WRONG_ROLE"  # type: ignore[arg-type]
        assert snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd")) == before
    finally:
        agent.stop()


def test_an_agent_whose_pod_is_gone_does_not_start(issuing_coordinator: Coordinator, kube: KubeStandIn,
                                                   pki: Path, tmp_path: Path) -> None:
    kube.add_node("node-1")
    pod = kube.add_pod("holdfast", "holdfast-agent-node-1", "node-1")
    token_file = tmp_path / "token"
    token_file.write_text(kube.token(pod))
    del kube.state.pods[("holdfast", "holdfast-agent-node-1")]
    agent_dir = tmp_path / "agent-tls"
    done = subprocess.run(
        [sys.executable, "-m", "holdfast.cli", "agent", "serve", "--listen", "127.0.0.1:0",
         "--host-id", "node-1", *enroll_args(issuing_coordinator, pki, agent_dir, token_file)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 77, done.stderr
    assert "TOKEN_REJECTED" in done.stderr
    assert not (agent_dir / "agent-node-1.pem").exists()
