"""A session pod's `holdfast run` with no certificate of its own: it enrolls, and renews while CMD runs.

Real processes: a TLS etcd, `coordinator serve --enroll-listen --session-namespaces team-a
--session-lifetime-seconds 10` against the stand-in API server, an agent, and `holdfast run` given
only HOLDFAST_ENROLL, its CA, the pod's token and an empty TLS directory. CMD writes through the
fence, waits until the first certificate has expired and a renewed one is installed, the
coordinator is restarted (so every connection is made again, with whatever certificate each
channel holds), and CMD writes again. The run keeps its grant throughout, both writes land, and
the release after the restart goes through: `run`'s own channel presents the renewed certificate.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from holdfast.common import certs, tls
from holdfast.common.tls import Role, role_of_certificate
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.k8s_standin import KubeStandIn
from tests.integration.run_fixtures import until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.k8s_standin"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")]
SESSION = "team-a-renewal-01"

CMD = textwrap.dedent("""
    import os, pathlib, subprocess, sys, time
    from cryptography import x509
    renewed, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    pem = pathlib.Path(os.environ["HOLDFAST_TLS_DIR"]) / "client.pem"
    first = pem.read_bytes()
    ends = x509.load_pem_x509_certificate(first).not_valid_after_utc.timestamp()
    def put(key, value):
        subprocess.run([sys.executable, "-m", "holdfast.cli", "put", key, value], check=True)
    put("before", "1")
    # The first certificate's end is a time, so time is what is waited for; then its successor.
    while time.time() < ends + 0.5 or pem.read_bytes() == first:
        time.sleep(0.1)
    renewed.write_text("renewed")
    while not go.exists():
        time.sleep(0.05)
    put("after", "2")
""")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki")) / "ca"
    certs.init_local(base, ["node-1"], ["127.0.0.1", "localhost"])
    certs.issue_one(base, Role("client", "", "team-a"), [], base / "team-a")  # the test's own reader
    return base


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(Path(tmp_path_factory.mktemp("etcd-tls")) / "data", fast_election=True,
                        tls_dir=pki / "etcd").start()
    try:
        yield server
    finally:
        server.stop()


def record(coordinator: Coordinator, pki: Path) -> pb.GetSessionResponse:
    with tls.open_channel(coordinator.address, pki / "team-a", Role("client"), sync=True) as channel:
        return coordinator_pb2_grpc.CoordinatorStub(channel).GetSession(
            pb.GetSessionRequest(session_id=SESSION), timeout=10)


def fenced(coordinator: Coordinator, pki: Path, key: str) -> bytes:
    with tls.open_channel(coordinator.address, pki / "team-a", Role("client"), sync=True) as channel:
        found = coordinator_pb2_grpc.CoordinatorStub(channel).FencedGet(
            pb.FencedGetRequest(session_id=SESSION, key=key), timeout=10)
    return found.value if found.found else b""


def test_run_enrolls_renews_and_keeps_its_grant_across_an_expired_first_certificate(
        tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path, kube: KubeStandIn) -> None:
    with socket.socket() as probe:  # the issuer keeps its address across the coordinator's restart
        probe.bind(("127.0.0.1", 0))
        enroll_listen = f"127.0.0.1:{probe.getsockname()[1]}"
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki), "--enroll-listen", enroll_listen, "--enroll-api-server", kube.url,
        "--enroll-api-ca", str(kube.ca_file), "--enroll-api-token-file", str(kube.issuer_token_file),
        "--enroll-namespace", "holdfast", "--session-namespaces", "team-a",
        "--session-lifetime-seconds", "10")).start()
    agent = None
    try:
        agent = AgentProcess(tmp_path, "node-1", args=["--tls-dir", str(pki), "--coordinator",
                                                       coordinator.address])
        kube.add_node("node-1")
        pod = kube.add_pod("team-a", "session-review", "node-1", owner=("Job", "review"),
                           service_account="runner")
        token = tmp_path / "token"
        token.write_text(kube.token(pod, with_node=True))
        pod_tls = tmp_path / "pod-tls"  # empty: no secret mounted
        script, renewed, go = tmp_path / "cmd.py", tmp_path / "renewed", tmp_path / "go"
        script.write_text(CMD)
        env = {**os.environ, "HOLDFAST_ENROLL": coordinator.enroll, "HOLDFAST_ENROLL_CA": str(pki / "ca.pem"),
               "HOLDFAST_TOKEN_FILE": str(token), "HOLDFAST_TLS_DIR": str(pod_tls),
               "HOLDFAST_HOST_ID": "node-1", "HOLDFAST_COORDINATOR": coordinator.address}
        stderr = tmp_path / "run.stderr"
        with open(stderr, "wb") as err:
            run = subprocess.Popen([sys.executable, "-m", "holdfast.cli", "run", "--session", SESSION, "--",
                                    sys.executable, str(script), str(renewed), str(go)],
                                   env=env, stderr=err, stdin=subprocess.DEVNULL)
        try:
            until("CMD saw its first certificate expire and a renewed one", renewed.exists, timeout=60)
            held = record(coordinator, pki).record
            assert held.lease.claim_status == pb.LIVE and held.tenant == "team-a"
            coordinator.stop()
            coordinator.start()  # every connection is made anew, with its channel's certificate
            go.write_text("go")
            assert run.wait(60) == 0, stderr.read_text()
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        final = record(coordinator, pki)
        assert final.record.lease.fence == held.lease.fence  # one grant for the whole run
        assert final.record.lease.claim_status == pb.RELEASED, stderr.read_text()
        assert fenced(coordinator, pki, "before") == b"1" and fenced(coordinator, pki, "after") == b"2"
        cert = x509.load_pem_x509_certificate((pod_tls / "client.pem").read_bytes())
        assert role_of_certificate(cert) == Role("client", "", "team-a")
        assert (pod_tls / "client.key").stat().st_mode & 0o777 == 0o600
    finally:
        if agent is not None:
            agent.stop()
        coordinator.stop()
