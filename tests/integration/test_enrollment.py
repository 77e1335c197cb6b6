"""Enrollment end to end: the issuer's listener, the official kubernetes client, a stand-in API server.

Signed: a running DaemonSet pod's token, with and without node claims, for its own node only; the
certificate names the pod and node uids. Refused, nothing signed (the issuer's count unchanged, no
certificate written): another node's CSR, another audience, another service account or namespace,
an expired or forged token, a deleted pod or node (also on renewal), a pod not of the DaemonSet or
not Running, garbage, malformed or oversize input, an RSA key. The agent CA can mint agent roles
only, and an enrolled node's certificate cannot register another host id.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from holdfast.agent import enroll as agent_enroll
from holdfast.common import certs, tls
from holdfast.common.authorization import RoleGate
from holdfast.common.reasons import reason_of
from holdfast.common.tls import Role, role_of_certificate
from holdfast.coordinator.authorization import coordinator_rule
from holdfast.enrollment import issuer as enrollment
from holdfast.enrollment import issuer_rules as rules
from holdfast.v1 import coordinator_pb2 as cpb
from holdfast.v1 import enrollment_pb2 as pb
from holdfast.v1 import enrollment_pb2_grpc as pb_grpc
from tests.integration.coordinator_fixtures import run_async
from tests.integration.k8s_standin import KubeStandIn

pytest_plugins = ["tests.integration.k8s_standin"]

pytestmark = pytest.mark.timeout(120)
NS = "holdfast"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki")) / "ca"
    certs.init_local(base, [], ["127.0.0.1", "localhost"])
    return base


@contextlib.asynccontextmanager
async def issuing(pki: Path, kube: KubeStandIn) -> AsyncIterator[tuple[str, enrollment.Issuer]]:
    api = enrollment.KubeApi(kube.url, str(kube.ca_file), str(kube.issuer_token_file))
    issuer = enrollment.Issuer.from_dir(pki, api, NS)
    serving = await enrollment.start("127.0.0.1:0", pki, issuer)
    try:
        yield serving.address, issuer
    finally:
        await serving.server.stop(0)
        api.close()


def agent_pod(kube: KubeStandIn, node: str = "node-1", **kwargs: object) -> dict:
    if node not in kube.state.nodes:
        kube.add_node(node)
    return kube.add_pod(NS, f"holdfast-agent-{node}", node, **kwargs)  # type: ignore[arg-type]


async def call(target: str, pki: Path, csr_pem: bytes, token: str) -> pb.EnrollResponse:
    return await agent_enroll.request(target, (pki / "ca.pem").read_bytes(), csr_pem, token)


async def refused(target: str, pki: Path, issuer: enrollment.Issuer, csr_pem: bytes, token: str,
                  code: grpc.StatusCode, reason: str) -> str:
    before = issuer.issued
    credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    async with grpc.aio.secure_channel(target, credentials) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await pb_grpc.EnrollmentStub(ch).Enroll(pb.EnrollRequest(csr_pem=csr_pem, token=token),
                                                    timeout=15)
    assert failure.value.code() == code, failure.value.details()
    assert reason_of(failure.value) == reason, failure.value.details()
    assert issuer.issued == before  # nothing signed
    return failure.value.details() or ""


@pytest.mark.parametrize("with_node", [False, True])
@run_async
async def test_a_daemonset_pod_gets_its_own_nodes_certificate(pki: Path, kube: KubeStandIn, tmp_path: Path,
                                                               with_node: bool) -> None:
    pod = agent_pod(kube)
    token = kube.token(pod, with_node=with_node)
    async with issuing(pki, kube) as (target, issuer):
        creds = await agent_enroll.enroll(target, (pki / "ca.pem").read_bytes(), "node-1", token)
    assert issuer.issued == 1
    out = agent_enroll.write(tmp_path / "agent-tls", "node-1", creds)
    cert = x509.load_pem_x509_certificate(out.read_bytes())
    assert role_of_certificate(cert) == Role("agent", "node-1")
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.UniformResourceIdentifier)
    assert f"holdfast-pod://{pod['metadata']['uid']}" in uris
    assert f"holdfast-node://{kube.state.nodes['node-1']['metadata']['uid']}" in uris
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(hours=23) < lifetime <= datetime.timedelta(hours=24, minutes=5)
    assert cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == tls.AGENT_CA_NAME
    assert (out.parent / "agent-node-1.key").stat().st_mode & 0o777 == 0o600
    # The key made by the agent matches the certificate the issuer signed.
    key = serialization.load_pem_private_key((out.parent / "agent-node-1.key").read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]


@run_async
async def test_a_csr_for_another_node_is_refused_naming_both(pki: Path, kube: KubeStandIn) -> None:
    pod = agent_pod(kube, "node-1")
    kube.add_node("node-2")
    _, csr = agent_enroll.new_key_and_csr("node-2")
    async with issuing(pki, kube) as (target, issuer):
        message = await refused(target, pki, issuer, csr, kube.token(pod),
                                grpc.StatusCode.PERMISSION_DENIED, "NODE_MISMATCH")
    assert "node-1" in message and "node-2" in message


def _refusal_cases() -> list[tuple[str, str]]:
    return [("audience", "WRONG_AUDIENCE"), ("service_account", "WRONG_SERVICE_ACCOUNT"),
            ("namespace", "WRONG_SERVICE_ACCOUNT"), ("expired", "TOKEN_REJECTED"),
            ("forged", "TOKEN_REJECTED"), ("garbage", "TOKEN_REJECTED"),
            ("not_daemonset", "POD_NOT_BOUND"), ("pending", "POD_NOT_BOUND")]


@pytest.mark.parametrize(("case", "reason"), _refusal_cases())
@run_async
async def test_tokens_that_do_not_prove_a_running_agent_pod_are_refused(
        pki: Path, kube: KubeStandIn, case: str, reason: str) -> None:
    if case == "namespace":
        kube.add_node("node-1")
        pod = kube.add_pod("default", "holdfast-agent-node-1", "node-1")
    elif case == "not_daemonset":
        pod = agent_pod(kube, owner=("ReplicaSet", "holdfast-agent-7d9f"))
    elif case == "pending":
        pod = agent_pod(kube, phase="Pending")
    else:
        pod = agent_pod(kube)
    token = {
        "audience": lambda: kube.token(pod, audience="vault"),
        "service_account": lambda: kube.token(pod, service_account="default"),
        "expired": lambda: kube.token(pod, expires_in=600, now=0),
        "forged": lambda: kube.token(pod, signing_key=ec.generate_private_key(ec.SECP256R1())),
        "garbage": lambda: "not-a-jwt",
    }.get(case, lambda: kube.token(pod))()
    _, csr = agent_enroll.new_key_and_csr("node-1")
    async with issuing(pki, kube) as (target, issuer):
        message = await refused(target, pki, issuer, csr, token, grpc.StatusCode.PERMISSION_DENIED, reason)
    assert message


@pytest.mark.parametrize("checked_by_api_server", [True, False])
@run_async
async def test_a_deleted_pod_or_node_is_refused_and_so_is_renewal_after_it(
        pki: Path, kube: KubeStandIn, checked_by_api_server: bool) -> None:
    """The real API server already refuses a bound token whose pod is gone (TOKEN_REJECTED); the
    issuer's own reads refuse it too when the deletion lands after the review (POD_NOT_FOUND)."""
    kube.state.check_bound_objects = checked_by_api_server
    pod = agent_pod(kube)
    async with issuing(pki, kube) as (target, issuer):
        await agent_enroll.enroll(target, (pki / "ca.pem").read_bytes(), "node-1", kube.token(pod))
        del kube.state.pods[(NS, pod["metadata"]["name"])]
        _, csr = agent_enroll.new_key_and_csr("node-1")
        await refused(target, pki, issuer, csr, kube.token(pod), grpc.StatusCode.PERMISSION_DENIED,
                      "TOKEN_REJECTED" if checked_by_api_server else "POD_NOT_FOUND")
        # A pod re-created with the same name is another pod: the old token's uid does not match.
        kube.state.pods[(NS, pod["metadata"]["name"])] = {**pod, "metadata": {**pod["metadata"], "uid": "x"}}
        await refused(target, pki, issuer, csr, kube.token(pod), grpc.StatusCode.PERMISSION_DENIED,
                      "TOKEN_REJECTED" if checked_by_api_server else "POD_NOT_FOUND")
        pod = agent_pod(kube, "node-2")
        del kube.state.nodes["node-2"]
        await refused(target, pki, issuer, csr, kube.token(pod), grpc.StatusCode.PERMISSION_DENIED,
                      "NODE_NOT_FOUND")
    assert issuer.issued == 1


@run_async
async def test_node_claims_must_match_the_pods_node(pki: Path, kube: KubeStandIn) -> None:
    kube.state.check_bound_objects = False  # the node replaced between the review and our read
    pod = agent_pod(kube)
    token = kube.token(pod, with_node=True)
    kube.add_node("node-1")  # same name, new uid
    _, csr = agent_enroll.new_key_and_csr("node-1")
    async with issuing(pki, kube) as (target, issuer):
        await refused(target, pki, issuer, csr, token, grpc.StatusCode.PERMISSION_DENIED, "NODE_MISMATCH")


def _csr_of(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "holdfast://agent/node-1")]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("case", ["malformed", "rsa", "p384", "oversize_csr", "oversize_token", "empty"])
@run_async
async def test_bad_input_is_invalid_argument_before_the_api_server_is_asked(
        pki: Path, kube: KubeStandIn, case: str) -> None:
    pod = agent_pod(kube)
    _, good = agent_enroll.new_key_and_csr("node-1")
    token = kube.token(pod)
    csr, token, reason = {
        "malformed": (b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                      token, "CSR_INVALID"),
        "rsa": (_csr_of(rsa.generate_private_key(public_exponent=65537, key_size=2048)), token,
                "CSR_INVALID"),
        "p384": (_csr_of(ec.generate_private_key(ec.SECP384R1())), token, "CSR_INVALID"),
        "oversize_csr": (good + b"\n" * rules.MAX_CSR_BYTES, token, "INVALID_ARGUMENT"),
        "oversize_token": (good, "a" * (rules.MAX_TOKEN_BYTES + 1), "INVALID_ARGUMENT"),
        "empty": (good, "", "INVALID_ARGUMENT"),
    }[case]
    async with issuing(pki, kube) as (target, issuer):
        message = await refused(target, pki, issuer, csr, token, grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert message
    assert kube.state.reviews == 0


def test_the_agent_ca_mints_agent_roles_only(pki: Path) -> None:
    key, ca = certs.load_ca(pki, tls.AGENT_CA_STEM)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    for uri, role in [("holdfast://coordinator", None), ("holdfast://operator", None),
                      ("holdfast://client", None), ("holdfast://agent/node-1", Role("agent", "node-1"))]:
        cert = certs.sign_agent(key, ca, leaf_key.public_key(), "node-1", [uri], datetime.timedelta(hours=1))
        assert role_of_certificate(cert) == role, uri
    # ca.pem's own certificates keep their roles.
    coordinator = x509.load_pem_x509_certificate((pki / "coordinator.pem").read_bytes())
    assert role_of_certificate(coordinator) == Role("coordinator")


@run_async
async def test_an_agent_ca_certificate_claiming_operator_is_refused_at_the_gate(pki: Path) -> None:
    """Over real mTLS: the coordinator's role gate sees no role in an agent-CA operator certificate."""
    from holdfast.common import serving as serving_
    from holdfast.v1 import coordinator_pb2_grpc

    key, ca = certs.load_ca(pki, tls.AGENT_CA_STEM)
    leaf = ec.generate_private_key(ec.SECP256R1())
    forged = certs.sign_agent(key, ca, leaf.public_key(), "node-1", ["holdfast://operator"],
                              datetime.timedelta(hours=1))
    serving = await serving_.start("127.0.0.1:0", "holdfast.v1.Coordinator",
                                   lambda server: coordinator_pb2_grpc.add_CoordinatorServicer_to_server(
                                       coordinator_pb2_grpc.CoordinatorServicer(), server),
                                   tls.server_credentials(pki, Role("coordinator")),
                                   [RoleGate("holdfast.v1.Coordinator", coordinator_rule)])
    try:
        creds = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(),
            leaf.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption()),
            forged.public_bytes(serialization.Encoding.PEM))
        async with grpc.aio.secure_channel(serving.address, creds) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await coordinator_pb2_grpc.CoordinatorStub(channel).DrainHost(cpb.DrainHostRequest(),
                                                                              timeout=10)
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason_of(failure.value) == "UNAUTHENTICATED"
    finally:
        await serving.server.stop(0)


@run_async
async def test_an_enrolled_nodes_certificate_registers_only_its_own_host(pki: Path, kube: KubeStandIn,
                                                                        tmp_path: Path) -> None:
    """The RegisterHost rule with the enrolled certificate's role: its own host admitted, another refused."""
    pod = agent_pod(kube)
    async with issuing(pki, kube) as (target, _issuer):
        creds = await agent_enroll.enroll(target, (pki / "ca.pem").read_bytes(), "node-1", kube.token(pod))
    role = role_of_certificate(x509.load_pem_x509_certificate(creds.cert_pem))
    assert role == Role("agent", "node-1")
    own = cpb.RegisterHostRequest(registration=cpb.HostRegistration(host_id="node-1"))
    other = cpb.RegisterHostRequest(registration=cpb.HostRegistration(host_id="node-2"))
    assert coordinator_rule("RegisterHost", role, own) is None
    refusal = coordinator_rule("RegisterHost", role, other)
    assert refusal is not None and refusal.reason == "WRONG_ROLE"


def test_sizes_are_checked_first() -> None:
    with pytest.raises(rules.Refusal) as refusal:
        rules.check_sizes(b"x" * (rules.MAX_CSR_BYTES + 1), "t")
    assert refusal.value.code == grpc.StatusCode.INVALID_ARGUMENT
