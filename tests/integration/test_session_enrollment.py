"""Session pods' enrollment: the issuer's listener, the official kubernetes client, a stand-in API
server, and the client's own enroller (holdfast.client.enrollment), as `holdfast run` uses it.

Signed: a team-a pod's token gives a certificate of the client role for tenant team-a (or the tenant
the table maps its namespace to), naming spiffe://<trust domain>/ns/<ns>/sa/<sa> and the pod, from
the session CA, with the configured lifetime. Refused, nothing signed and nothing written: another
audience, an expired token, a pod that does not exist (or was replaced), a pod running another
ServiceAccount, a namespace not allowed (the issuer's own too, with `*`), another node than the
pod's, a CSR asking for more than its client role. The session CA mints nothing but one tenant's
client role, whatever the certificate claims: over mTLS, a real coordinator sees no role in one
claiming to be an operator or an agent.

And through the real commands (root: the agent reads other processes' environments): a TLS etcd,
`coordinator serve --enroll-listen --session-namespaces team-a --session-lifetime-seconds 20`, an
agent, and `holdfast run` given only HOLDFAST_ENROLL, its CA, the pod's token and an empty TLS
directory. CMD writes through the fence, waits until the first certificate has expired and a
renewed one is installed, the coordinator is restarted (every connection is made again, with
whatever certificate each channel holds), and CMD writes again. The run keeps its grant, both
writes land, and the release after the restart goes through: `run`'s own channel presents the
renewed certificate.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from holdfast.client.enrollment import Enroller
from holdfast.client.errors import ClientError
from holdfast.common import certs, tls
from holdfast.common.reasons import Reason, reason_of
from holdfast.common.tls import Role, role_of_certificate
from holdfast.coordinator.store import etcd_credentials
from holdfast.enrollment import issuer as enrollment
from holdfast.enrollment import session_rules
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as cpb
from holdfast.v1 import coordinator_pb2_grpc
from holdfast.v1 import enrollment_pb2 as pb
from holdfast.v1 import enrollment_pb2_grpc as pb_grpc
from tests.integration import unprivileged
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator, run_async, snapshot
from tests.integration.k8s_standin import KubeStandIn
from tests.integration.run_fixtures import until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.k8s_standin"]
pytestmark = pytest.mark.timeout(120)
HOLDFAST_NS = "holdfast"
TABLE = "team-a, team-b=shared"
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
    certs.issue_one(base, Role("client", "", "team-a"), [], base / "team-a")  # the tests' own reader
    return base


@contextlib.asynccontextmanager
async def issuing(pki: Path, kube: KubeStandIn, table: str = TABLE,
                  lifetime: datetime.timedelta = enrollment.DEFAULT_SESSION_LIFETIME,
                  ) -> AsyncIterator[tuple[str, enrollment.Issuer]]:
    api = enrollment.KubeApi(kube.url, str(kube.ca_file), str(kube.issuer_token_file))
    policy = session_rules.parse_namespaces(table, HOLDFAST_NS, "example.org")
    issuer = enrollment.Issuer.from_dir(pki, api, HOLDFAST_NS,
                                        sessions=enrollment.SessionSigning.from_dir(pki, policy, lifetime))
    serving = await enrollment.start("127.0.0.1:0", pki, issuer)
    try:
        yield serving.address, issuer
    finally:
        await serving.server.stop(0)
        api.close()


def session_pod(kube: KubeStandIn, namespace: str = "team-a", node: str = "node-1",
                service_account: str = "runner") -> dict:
    if node not in kube.state.nodes:
        kube.add_node(node)
    return kube.add_pod(namespace, f"session-{namespace}", node, owner=("Job", "review-42"),
                        service_account=service_account)


def enroller(target: str, pki: Path, tmp_path: Path, token: str, node: str = "node-1") -> Enroller:
    token_file = tmp_path / "token"
    token_file.write_text(token)
    return Enroller(target, pki / "ca.pem", token_file, tmp_path / "pod-tls", node)


def uris_of(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.UniformResourceIdentifier)


@pytest.mark.parametrize(("namespace", "tenant"), [("team-a", "team-a"), ("team-b", "shared")])
@run_async
async def test_a_pods_token_gives_its_namespaces_tenant_a_short_lived_client_certificate(
        pki: Path, kube: KubeStandIn, tmp_path: Path, namespace: str, tenant: str) -> None:
    pod = session_pod(kube, namespace)
    async with issuing(pki, kube) as (target, issuer):
        pod_enroller = enroller(target, pki, tmp_path, kube.token(pod, with_node=True))
        await pod_enroller.ensure()
        await pod_enroller.ensure()  # a valid pair installed: nothing asked
    assert issuer.issued == 1
    out = tmp_path / "pod-tls"
    cert = x509.load_pem_x509_certificate((out / "client.pem").read_bytes())
    assert role_of_certificate(cert) == Role("client", "", tenant)
    assert f"spiffe://example.org/ns/{namespace}/sa/runner" in uris_of(cert)
    assert f"holdfast-pod://{pod['metadata']['uid']}" in uris_of(cert)
    assert cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == tls.SESSION_CA_NAME
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(minutes=59) < lifetime <= datetime.timedelta(minutes=65)
    assert (out / "client.key").stat().st_mode & 0o777 == 0o600
    key = serialization.load_pem_private_key((out / "client.key").read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    # What it trusts: the coordinators' CA, and the agent and session CAs.
    assert (out / "ca.pem").read_bytes() == tls.trust_bundle(pki)


def _refusal_cases() -> list[tuple[str, str]]:
    return [("audience", "WRONG_AUDIENCE"), ("expired", "TOKEN_REJECTED"),
            ("pod_gone_reviewed", "TOKEN_REJECTED"), ("pod_gone", "POD_NOT_FOUND"),
            ("pod_replaced", "POD_NOT_FOUND"), ("other_service_account", "WRONG_SERVICE_ACCOUNT"),
            ("namespace", "NAMESPACE_NOT_ALLOWED"), ("own_namespace", "NAMESPACE_NOT_ALLOWED"),
            ("other_node", "NODE_MISMATCH"), ("pending", "POD_NOT_BOUND")]


@pytest.mark.parametrize(("case", "reason"), _refusal_cases())
@run_async
async def test_tokens_that_do_not_prove_an_allowed_running_pod_are_refused_and_nothing_is_signed(
        pki: Path, kube: KubeStandIn, tmp_path: Path, case: str, reason: str) -> None:
    namespace = {"namespace": "team-c", "own_namespace": HOLDFAST_NS}.get(case, "team-a")
    pod = session_pod(kube, namespace)
    token = {"audience": lambda: kube.token(pod, audience="vault"),
             "expired": lambda: kube.token(pod, expires_in=600, now=0),
             # The pod runs `runner`; the token is another ServiceAccount's, bound to that pod.
             "other_service_account": lambda: kube.token(pod, service_account="deployer")}.get(
                 case, lambda: kube.token(pod))()
    key = (namespace, pod["metadata"]["name"])
    if case == "pod_gone_reviewed":
        del kube.state.pods[key]  # the API server itself refuses a bound token whose pod is gone
    if case in ("pod_gone", "pod_replaced"):
        kube.state.check_bound_objects = False  # gone between the TokenReview and the issuer's read
        if case == "pod_gone":
            del kube.state.pods[key]
        else:
            kube.state.pods[key] = {**pod, "metadata": {**pod["metadata"], "uid": "another"}}
    if case == "pending":
        pod["status"]["phase"] = "Pending"
    table = f"{TABLE}, *" if case == "own_namespace" else TABLE
    async with issuing(pki, kube, table) as (target, issuer):
        pod_enroller = enroller(target, pki, tmp_path, token, "node-2" if case == "other_node" else "node-1")
        with pytest.raises(ClientError) as refused:
            await pod_enroller.ensure()
        assert issuer.issued == 0
    assert refused.value.reason == Reason.ENROLLMENT_REFUSED
    assert refused.value.exit_code == 77
    assert reason in refused.value.message
    assert not (tmp_path / "pod-tls" / "client.pem").exists()
    assert not (tmp_path / "pod-tls" / "client.key").exists()


def _csr(key: ec.EllipticCurvePrivateKey, uris: list[str]) -> bytes:
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "holdfast://client")]))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                          critical=False)
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("uris", [["holdfast://operator"], ["holdfast://agent/node-1"],
                                  ["holdfast://client", "holdfast-tenant://team-b"],
                                  ["holdfast://client", "holdfast-tenant://*"], ["holdfast://coordinator"]])
@run_async
async def test_a_csr_asking_for_more_than_its_client_role_is_refused(
        pki: Path, kube: KubeStandIn, uris: list[str]) -> None:
    pod = session_pod(kube)
    async with issuing(pki, kube) as (target, issuer):
        credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        async with grpc.aio.secure_channel(target, credentials) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await pb_grpc.EnrollmentStub(channel).EnrollSession(pb.EnrollSessionRequest(
                    csr_pem=_csr(ec.generate_private_key(ec.SECP256R1()), uris), token=kube.token(pod)),
                    timeout=15)
        assert issuer.issued == 0
    assert failure.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert reason_of(failure.value) == "ROLE_NOT_ALLOWED"


@run_async
async def test_an_issuer_without_a_session_table_signs_no_session(pki: Path, kube: KubeStandIn,
                                                                  tmp_path: Path) -> None:
    api = enrollment.KubeApi(kube.url, str(kube.ca_file), str(kube.issuer_token_file))
    issuer = enrollment.Issuer.from_dir(pki, api, HOLDFAST_NS)
    serving = await enrollment.start("127.0.0.1:0", pki, issuer)
    try:
        with pytest.raises(ClientError) as refused:
            await enroller(serving.address, pki, tmp_path, kube.token(session_pod(kube))).ensure()
    finally:
        await serving.server.stop(0)
        api.close()
    assert "NAMESPACE_NOT_ALLOWED" in refused.value.message and issuer.issued == 0
    assert kube.state.reviews == 0


def sign_by_session_ca(pki: Path, uris: list[str]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key, ca = certs.load_ca(pki, tls.SESSION_CA_STEM)
    leaf = ec.generate_private_key(ec.SECP256R1())
    return leaf, certs.sign_session(key, ca, leaf.public_key(), uris, datetime.timedelta(hours=1))


def test_the_session_ca_mints_one_tenants_client_role_only(pki: Path) -> None:
    cases: list[tuple[list[str], Role | None]] = [
        (["holdfast://client", "holdfast-tenant://team-a"], Role("client", "", "team-a")),
        (["holdfast://client"], None),  # no tenant: it would be the default tenant's
        (["holdfast://client", "holdfast-tenant://*"], None),
        (["holdfast://operator", "holdfast-tenant://team-a"], None),
        (["holdfast://operator", "holdfast-tenant://*"], None),
        (["holdfast://agent/node-1"], None), (["holdfast://maintenance"], None),
        (["holdfast://coordinator"], None)]
    for uris, role in cases:
        assert role_of_certificate(sign_by_session_ca(pki, uris)[1]) == role, uris


@pytest.mark.parametrize("uris", [["holdfast://operator", "holdfast-tenant://*"],
                                  ["holdfast://agent/node-1"], ["holdfast://maintenance"]])
def test_a_session_ca_certificate_claiming_operator_or_agent_gets_no_role_over_the_wire(
        pki: Path, tls_etcd: EtcdServer, tmp_path: Path, prefix: str, uris: list[str]) -> None:
    """A real coordinator process over mTLS: the forged certificate's calls are UNAUTHENTICATED,
    etcd unchanged; the same CA's team-a client certificate is a runtime of team-a."""
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=("--tls-dir", str(pki))).start()
    try:
        before = snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd"))

        def stub_of(leaf_uris: list[str]) -> tuple[grpc.Channel, coordinator_pb2_grpc.CoordinatorStub]:
            leaf, cert = sign_by_session_ca(pki, leaf_uris)
            creds = grpc.ssl_channel_credentials(
                (pki / "ca.pem").read_bytes(),
                leaf.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()),
                cert.public_bytes(serialization.Encoding.PEM))
            channel = grpc.secure_channel(coordinator.address, creds)
            return channel, coordinator_pb2_grpc.CoordinatorStub(channel)

        channel, stub = stub_of(uris)
        with channel:
            registration = cpb.HostRegistration(host_id="node-1", address="127.0.0.1:1")
            for call, request in [(stub.DrainHost, cpb.DrainHostRequest(host_id="node-1")),
                                  (stub.ListSessions, cpb.ListSessionsRequest()),
                                  (stub.RegisterHost, cpb.RegisterHostRequest(registration=registration,
                                                                              ttl_seconds=10))]:
                with pytest.raises(grpc.RpcError) as failure:
                    call(request, timeout=10)
                assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
                assert reason_of(failure.value) == "UNAUTHENTICATED"  # type: ignore[arg-type]
        channel, stub = stub_of(["holdfast://client", "holdfast-tenant://team-a"])
        with channel:
            assert stub.ListSessions(cpb.ListSessionsRequest(), timeout=10) is not None
            with pytest.raises(grpc.RpcError) as failure:  # a runtime, not an operator
                stub.DrainHost(cpb.DrainHostRequest(host_id="node-1"), timeout=10)
            assert failure.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd")) == before
    finally:
        coordinator.stop()


def test_the_table_of_namespaces_is_checked() -> None:
    policy = session_rules.parse_namespaces("team-a team-b=shared,*", "holdfast")
    assert policy.tenant("team-a") == "team-a" and policy.tenant("team-b") == "shared"
    assert policy.tenant("team-z") == "team-z"
    with pytest.raises(session_rules.Refusal):
        policy.tenant("holdfast")
    with pytest.raises(session_rules.Refusal):
        session_rules.parse_namespaces("team-a").tenant("team-b")
    for bad in ("Team-A", "team-a=", "team-a=x_y", "team-a, team-a=b", "a" * 64):
        with pytest.raises(ValueError):
            session_rules.parse_namespaces(bad)
    with pytest.raises(ValueError):
        session_rules.parse_namespaces("team-a", trust_domain="Example.ORG")


def test_the_enroller_needs_a_tls_dir_and_reads_the_documented_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOLDFAST_ENROLL", raising=False)
    assert Enroller.from_env(tmp_path, "node-1") is None
    monkeypatch.setenv("HOLDFAST_ENROLL", "127.0.0.1:7602")
    with pytest.raises(ClientError) as missing:
        Enroller.from_env(None, "node-1")
    assert missing.value.reason == Reason.INVALID_ARGUMENT
    monkeypatch.setenv("HOLDFAST_ENROLL_CA", "/etc/holdfast/ca/ca.pem")
    monkeypatch.setenv("HOLDFAST_TOKEN_FILE", "/var/run/secrets/holdfast/token")
    got = Enroller.from_env(tmp_path, "node-1")
    assert got == Enroller("127.0.0.1:7602", Path("/etc/holdfast/ca/ca.pem"),
                           Path("/var/run/secrets/holdfast/token"), tmp_path, "node-1")
    assert os.environ["HOLDFAST_ENROLL"] == "127.0.0.1:7602"


def record(coordinator: Coordinator, pki: Path) -> cpb.GetSessionResponse:
    with tls.open_channel(coordinator.address, pki / "team-a", Role("client"), sync=True) as channel:
        return coordinator_pb2_grpc.CoordinatorStub(channel).GetSession(
            cpb.GetSessionRequest(session_id=SESSION), timeout=10)


def fenced(coordinator: Coordinator, pki: Path, key: str) -> bytes:
    with tls.open_channel(coordinator.address, pki / "team-a", Role("client"), sync=True) as channel:
        found = coordinator_pb2_grpc.CoordinatorStub(channel).FencedGet(
            cpb.FencedGetRequest(session_id=SESSION, key=key), timeout=10)
    return found.value if found.found else b""


def pod_run_env(kube: KubeStandIn, coordinator: Coordinator, pki: Path, tmp_path: Path, pod_name: str,
                pod_tls: Path) -> dict[str, str]:
    """A session pod on node-1 and the environment its `holdfast run` enrolls with into `pod_tls`."""
    kube.add_node("node-1")
    pod = kube.add_pod("team-a", pod_name, "node-1", owner=("Job", "review"), service_account="runner")
    token = tmp_path / "token"
    token.write_text(kube.token(pod, with_node=True))
    return {**os.environ, "HOLDFAST_ENROLL": coordinator.enroll, "HOLDFAST_ENROLL_CA": str(pki / "ca.pem"),
            "HOLDFAST_TOKEN_FILE": str(token), "HOLDFAST_TLS_DIR": str(pod_tls),
            "HOLDFAST_HOST_ID": "node-1", "HOLDFAST_COORDINATOR": coordinator.address}


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")
def test_run_enrolls_renews_and_keeps_its_grant_across_an_expired_first_certificate(
        tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path, kube: KubeStandIn) -> None:
    with socket.socket() as probe:  # the issuer keeps its address across the coordinator's restart
        probe.bind(("127.0.0.1", 0))
        enroll_listen = f"127.0.0.1:{probe.getsockname()[1]}"
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki), "--enroll-listen", enroll_listen, "--enroll-api-server", kube.url,
        "--enroll-api-ca", str(kube.ca_file), "--enroll-api-token-file", str(kube.issuer_token_file),
        "--enroll-namespace", "holdfast", "--session-namespaces", "team-a",
        "--session-lifetime-seconds", "20")).start()
    agent = None
    try:
        agent = AgentProcess(tmp_path, "node-1", args=["--tls-dir", str(pki), "--coordinator",
                                                       coordinator.address])
        pod_tls = tmp_path / "pod-tls"  # empty: no secret mounted
        env = pod_run_env(kube, coordinator, pki, tmp_path, "session-review", pod_tls)
        script, renewed, go = tmp_path / "cmd.py", tmp_path / "renewed", tmp_path / "go"
        script.write_text(CMD)
        stderr = tmp_path / "run.stderr"
        with open(stderr, "wb") as err:
            run = subprocess.Popen([sys.executable, "-m", "holdfast.cli", "run", "--session", SESSION, "--",
                                    sys.executable, str(script), str(renewed), str(go)],
                                   env=env, stderr=err, stdin=subprocess.DEVNULL)
        try:
            until("CMD saw its first certificate expire and a renewed one", renewed.exists, timeout=60)
            held = record(coordinator, pki).record
            assert held.lease.claim_status == cpb.LIVE and held.tenant == "team-a"
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
        assert final.record.lease.claim_status == cpb.RELEASED, stderr.read_text()
        assert fenced(coordinator, pki, "before") == b"1" and fenced(coordinator, pki, "after") == b"2"
        cert = x509.load_pem_x509_certificate((pod_tls / "client.pem").read_bytes())
        assert role_of_certificate(cert) == Role("client", "", "team-a")
        assert (pod_tls / "client.key").stat().st_mode & 0o777 == 0o600
    finally:
        if agent is not None:
            agent.stop()
        coordinator.stop()


SWAP_CMD = textwrap.dedent("""
    import os, subprocess, sys
    tls, rogue, drop = os.environ["HOLDFAST_TLS_DIR"], sys.argv[1], sys.argv[2:]
    # Another user in the pod: their CA renamed over ca.pem in the emptyDir, a FIFO beside it.
    swap = 'cp "$1" "$2/.theirs" && mv -f "$2/.theirs" "$2/ca.pem" && mkfifo "$2/session-ca.pem"'
    subprocess.run([*drop, "/bin/sh", "-c", swap, "sh", rogue, tls], check=True)
    subprocess.run([sys.executable, "-m", "holdfast.cli", "put", "after-swap", "1"], check=True, timeout=30)
""")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")
def test_an_enrolled_run_in_a_0777_emptydir_trusts_nothing_another_user_puts_there(
        tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path, kube: KubeStandIn) -> None:
    """The pod's TLS directory is an emptyDir, 0777: root's run enrolled into it, and nobody, mid-
    CMD, renamed their CA over its ca.pem and put a FIFO at session-ca.pem: CMD's `holdfast put`
    trusted their CA (a rogue coordinator would get its grant and data) or waited on the FIFO for
    ever. Now everything is in the run's own 0700 holdfast-0 there, and the put is fenced."""
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki), "--enroll-listen", "127.0.0.1:0", "--enroll-api-server", kube.url,
        "--enroll-api-ca", str(kube.ca_file), "--enroll-api-token-file", str(kube.issuer_token_file),
        "--enroll-namespace", "holdfast", "--session-namespaces", "team-a")).start()
    agent = None
    shared = Path(tempfile.mkdtemp(prefix="holdfast-emptydir-"))  # nobody reaches it (pytest's tmp: no)
    try:
        shared.chmod(0o755)
        pod_tls = shared / "tls"
        pod_tls.mkdir()
        pod_tls.chmod(0o777)  # as kubelet makes an emptyDir
        certs.init_ca(shared / "rogue")
        (shared / "rogue").chmod(0o755)
        (shared / "rogue" / "ca.pem").chmod(0o644)
        agent = AgentProcess(tmp_path, "node-1", args=["--tls-dir", str(pki), "--coordinator",
                                                       coordinator.address])
        env = pod_run_env(kube, coordinator, pki, tmp_path, "session-emptydir", pod_tls)
        script = tmp_path / "cmd.py"
        script.write_text(SWAP_CMD)
        cmd = [sys.executable, str(script), str(shared / "rogue" / "ca.pem"), *unprivileged.DROP]
        done = subprocess.run([sys.executable, "-m", "holdfast.cli", "run", "--session", SESSION, "--", *cmd],
                              env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=90)
        assert done.returncode == 0, done.stderr
        assert fenced(coordinator, pki, "after-swap") == b"1"
        private = pod_tls / "holdfast-0"
        assert stat.S_IMODE(private.stat().st_mode) == 0o700 and (private / "client.pem").is_file()
        assert (pod_tls / "ca.pem").stat().st_uid == unprivileged.NOBODY  # theirs, never read
    finally:
        if agent is not None:
            agent.stop()
        coordinator.stop()
        shutil.rmtree(shared, ignore_errors=True)
