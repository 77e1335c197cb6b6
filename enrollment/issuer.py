"""The enrollment issuer: holdfast.v1.Enrollment on its own server-auth-only TLS listener.

Guarantee: an agent certificate is signed only after every rule of holdfast.enrollment.issuer_rules
admitted the request against the API server's answers of this call (TokenReview, the bound pod,
its node), and only ever with the agent CA's key, for `holdfast://agent/<the pod's node>`; a session
certificate only after every rule of holdfast.enrollment.session_rules admitted it, only with the
session CA's key, for `holdfast://client` of the pod's namespace's tenant; every decision is logged
with its reason, and a refusal signs nothing. The API server is asked through
the official `kubernetes` client (in-cluster configuration unless an API URL is given); its calls
are blocking, so they run on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import Counter

from holdfast.common import certs, reasons, tls
from holdfast.common import serving as serving_
from holdfast.enrollment import issuer_rules as rules
from holdfast.enrollment import session_rules
from holdfast.v1 import enrollment_pb2 as pb
from holdfast.v1 import enrollment_pb2_grpc as pb_grpc

log = logging.getLogger("holdfast.enrollment")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Enrollment"].full_name
DEFAULT_LIFETIME = datetime.timedelta(hours=24)
# A session pod's certificate lives an hour, as its projected token does (docs/decisions.md): no
# revocation list exists, so a deleted pod's key is good for at most what is left of that hour.
DEFAULT_SESSION_LIFETIME = datetime.timedelta(hours=1)
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
API_TIMEOUT_SECONDS = 5.0
Answer = TypeVar("Answer", pb.EnrollResponse, pb.EnrollSessionResponse)
ENROLLMENTS = Counter("holdfast_enrollments", "Enroll calls, by outcome (signed or the refusal reason)",
                      ["outcome"])


class KubeReader(Protocol):
    """The three API server reads the rules need, as the JSON the API server sends (None: 404)."""

    def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]: ...
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def read_node(self, name: str) -> dict[str, Any] | None: ...


class KubeApi:
    """KubeReader over the official client. Raw JSON (`_preload_content=False`) rather than models:
    the rules read the API reference's shapes, the same ones a stand-in answers."""

    def __init__(self, api_url: str = "", ca_file: str = "", token_file: str = "",
                 kubeconfig: str = "") -> None:
        from kubernetes import client, config  # heavy; only an issuer needs it

        configuration = client.Configuration()
        if kubeconfig:  # scripts/check-enrollment, from a workstation
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        elif api_url:
            configuration.host = api_url
            configuration.ssl_ca_cert = ca_file or None
            if token_file:
                # Re-read before each call: the issuer's own projected token is rotated by kubelet.
                def refresh(conf: client.Configuration) -> None:
                    conf.api_key = {"authorization": "Bearer " + Path(token_file).read_text().strip()}
                configuration.refresh_api_key_hook = refresh
                refresh(configuration)  # auth_settings looks for a key before it calls the hook
        else:
            config.load_incluster_config(client_configuration=configuration)
        self._api = client.ApiClient(configuration)
        self._auth = client.AuthenticationV1Api(self._api)
        self._core = client.CoreV1Api(self._api)
        self._exception = client.exceptions.ApiException

    def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": audiences}}
        return self._json(self._auth.create_token_review(body, _preload_content=False,
                                                         _request_timeout=API_TIMEOUT_SECONDS))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._maybe(functools.partial(self._core.read_namespaced_pod, name, namespace))

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self._maybe(functools.partial(self._core.read_node, name))

    def _maybe(self, read: Any) -> dict[str, Any] | None:
        try:
            return self._json(read(_preload_content=False, _request_timeout=API_TIMEOUT_SECONDS))
        except self._exception as exc:
            if exc.status == 404:
                return None
            raise

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        return json.loads(response.data)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._api.close()


def identify(kube: KubeReader, namespace: str, csr: x509.CertificateSigningRequest,
             token: str) -> rules.Identity:
    """Blocking: the API server's answers, in the order the rules need them, judged by the rules."""
    try:
        review = kube.token_review(token, [rules.AUDIENCE])
        claim = rules.check_review(review, token, namespace)
        node = rules.check_pod(kube.read_pod(namespace, claim.pod_name), claim)
        node_uid = rules.check_node(kube.read_node(node), node, claim)
    except rules.Refusal:
        raise
    except Exception as exc:  # the API server's trouble is never the caller's refusal
        why = f"the API server did not answer: {type(exc).__name__}: {str(exc)[:200]}"
        raise rules.Refusal(rules.Reason.ISSUER_UNAVAILABLE, why) from None
    rules.check_csr_role(csr, node)
    return rules.Identity(node, node_uid, claim.pod_name, claim.pod_uid)


def identify_session(kube: KubeReader, policy: session_rules.SessionPolicy,
                     csr: x509.CertificateSigningRequest, token: str,
                     said_node: str) -> session_rules.SessionIdentity:
    """Blocking: as `identify`, for a session pod. A namespace the policy does not allow is refused
    before its pod is read."""
    try:
        review = kube.token_review(token, [rules.AUDIENCE])
        claim = session_rules.check_review(review, token)
        tenant = policy.tenant(claim.namespace)
        pod = rules.found_pod(kube.read_pod(claim.namespace, claim.pod.pod_name), claim.pod)
        session_rules.check_pod(pod, claim, said_node)
        node = rules.running_node(pod, claim.pod)
        rules.check_node(kube.read_node(node), node, claim.pod)
    except rules.Refusal:
        raise
    except Exception as exc:  # as in identify
        why = f"the API server did not answer: {type(exc).__name__}: {str(exc)[:200]}"
        raise rules.Refusal(rules.Reason.ISSUER_UNAVAILABLE, why) from None
    session_rules.check_csr(csr, tenant)
    return session_rules.SessionIdentity(tenant, session_rules.spiffe_id(policy.trust_domain, claim),
                                         claim.pod.pod_uid, node)


@dataclass(frozen=True)
class SessionSigning:
    """The session CA and what it may sign: which namespaces, as which tenants, for how long."""

    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    policy: session_rules.SessionPolicy
    lifetime: datetime.timedelta = DEFAULT_SESSION_LIFETIME

    @classmethod
    def from_dir(cls, tls_dir: Path, policy: session_rules.SessionPolicy,
                 lifetime: datetime.timedelta = DEFAULT_SESSION_LIFETIME) -> SessionSigning:
        key, cert = certs.load_ca(tls_dir, tls.SESSION_CA_STEM)
        return cls(key, cert, policy, lifetime)


@dataclass
class Issuer:
    """Checks a request with the API server and signs with the agent CA."""

    kube: KubeReader
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    trust: bytes
    namespace: str
    lifetime: datetime.timedelta = DEFAULT_LIFETIME
    sessions: SessionSigning | None = None
    issued: int = field(default=0)

    @classmethod
    def from_dir(cls, tls_dir: Path, kube: KubeReader, namespace: str,
                 lifetime: datetime.timedelta = DEFAULT_LIFETIME,
                 sessions: SessionSigning | None = None) -> Issuer:
        key, cert = certs.load_ca(tls_dir, tls.AGENT_CA_STEM)
        return cls(kube, key, cert, tls.trust_bundle(tls_dir), namespace, lifetime, sessions)

    async def enroll(self, csr_pem: bytes, token: str) -> pb.EnrollResponse:
        rules.check_sizes(csr_pem, token)
        csr = rules.parse_csr(csr_pem)
        identity = await asyncio.to_thread(identify, self.kube, self.namespace, csr, token)
        cert = self._signed(csr, lambda key: certs.sign_agent(
            self.ca_key, self.ca_cert, key, identity.node, identity.uris(), self.lifetime),
            "enrollment signed", {"node": identity.node, "node_uid": identity.node_uid,
                                  "pod": identity.pod_name, "pod_uid": identity.pod_uid})
        return pb.EnrollResponse(certificate_pem=cert.public_bytes(serialization.Encoding.PEM),
                                 ca_bundle_pem=self.trust, node=identity.node,
                                 not_after_unix=int(cert.not_valid_after_utc.timestamp()))

    async def enroll_session(self, csr_pem: bytes, token: str, node: str) -> pb.EnrollSessionResponse:
        rules.check_sizes(csr_pem, token)
        if self.sessions is None:
            raise rules.Refusal(rules.Reason.NAMESPACE_NOT_ALLOWED, "this issuer signs no session "
                                "certificates (the coordinator's session_namespaces setting is empty)")
        csr = rules.parse_csr(csr_pem)
        signing = self.sessions
        identity = await asyncio.to_thread(identify_session, self.kube, signing.policy, csr, token, node)
        cert = self._signed(csr, lambda key: certs.sign_session(
            signing.ca_key, signing.ca_cert, key, identity.uris(), signing.lifetime),
            "session enrollment signed", {"tenant": identity.tenant, "spiffe_id": identity.spiffe_id,
                                          "pod_uid": identity.pod_uid, "node": identity.node})
        return pb.EnrollSessionResponse(certificate_pem=cert.public_bytes(serialization.Encoding.PEM),
                                        ca_bundle_pem=self.trust, tenant=identity.tenant,
                                        spiffe_id=identity.spiffe_id,
                                        not_after_unix=int(cert.not_valid_after_utc.timestamp()))


    def _signed(self, csr: x509.CertificateSigningRequest,
                sign: Callable[[ec.EllipticCurvePublicKey], x509.Certificate], event: str,
                fields: dict[str, str]) -> x509.Certificate:
        """The certificate `sign` makes for the CSR's key, counted and logged with `fields`."""
        public_key = csr.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)  # parse_csr admitted only P-256
        cert = sign(public_key)
        self.issued += 1
        log.info(event, extra={"fields": {**fields, "serial": format(cert.serial_number, "x"),
                                          "not_after": cert.not_valid_after_utc.isoformat()}})
        return cert


class EnrollmentService(pb_grpc.EnrollmentServicer):
    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer

    async def Enroll(self, request: pb.EnrollRequest, context: grpc.aio.ServicerContext) -> pb.EnrollResponse:
        return await self._answer(self.issuer.enroll(request.csr_pem, request.token), context)

    async def EnrollSession(self, request: pb.EnrollSessionRequest,
                            context: grpc.aio.ServicerContext) -> pb.EnrollSessionResponse:
        return await self._answer(self.issuer.enroll_session(request.csr_pem, request.token, request.node),
                                  context)

    async def _answer(self, signing: Awaitable[Answer], context: grpc.aio.ServicerContext) -> Answer:
        """The signed answer, or the refusal as its ErrorInfo reason; each one counted and logged."""
        try:
            response = await signing
        except rules.Refusal as refusal:
            ENROLLMENTS.labels(refusal.reason.value).inc()
            log.warning("enrollment refused", extra={"fields": {"reason": refusal.reason.value,
                                                                "why": refusal.message,
                                                                "peer": context.peer()}})
            await context.abort_with_status(reasons.status(refusal.code, refusal.reason, refusal.message))
            raise  # abort_with_status raises; this keeps the type checker honest
        ENROLLMENTS.labels("signed").inc()
        return response


def namespace_default() -> str:
    """The issuer's own namespace in a pod (holdfast's namespace), else `holdfast`."""
    try:
        return NAMESPACE_FILE.read_text().strip() or "holdfast"
    except OSError:
        return "holdfast"


def server_auth_credentials(tls_dir: Path) -> grpc.ServerCredentials:
    """The coordinator's certificate, and no client certificate asked for: an enrolling agent has
    none yet, and a token plus a CSR is all it can show."""
    read = tls.read_files(tls_dir, tls.Role("coordinator"))
    return grpc.ssl_server_credentials([(read.key_pem, read.cert_pem)], require_client_auth=False)


async def start(listen: str, tls_dir: Path, issuer: Issuer) -> serving_.Serving:
    service = EnrollmentService(issuer)
    add = functools.partial(pb_grpc.add_EnrollmentServicer_to_server, service)
    serving = await serving_.start(listen, SERVICE_NAME, add, server_auth_credentials(tls_dir))
    log.info("enrollment serving", extra={"fields": {"address": serving.address,
                                                     "namespace": issuer.namespace,
                                                     "lifetime_s": issuer.lifetime.total_seconds()}})
    return serving
