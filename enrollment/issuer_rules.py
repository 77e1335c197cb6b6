"""What an enrollment request must prove before the issuer signs an agent certificate. Pure: no I/O.

Guarantee: `decide` names the one node a request may speak for, or a `Refusal` with its reason, and
nothing in between. It admits only a token the API server authenticated (TokenReview) for audience
`holdfast`, of the `holdfast-agent` service account in holdfast's namespace, bound to a pod that
still exists with the token's pod uid, is owned by the `holdfast-agent` DaemonSet, runs, and sits on
a node that exists (and, when the token carries node claims, is the node the token names); and a
CSR for exactly that node's agent role, or for no role at all. The API objects are the JSON shapes
of the Kubernetes API reference, so the same rules judge the official client's answers and a
stand-in's. The unverified JWT payload is read only to explain a refusal the API server already
made (which audience the token carried), never to admit anything.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from holdfast.common.tls import NODE_URI_SCHEME, ROLE_SCHEME, Role

AUDIENCE = "holdfast"
SERVICE_ACCOUNT = "holdfast-agent"
DAEMONSET = "holdfast-agent"
MAX_CSR_BYTES = 8 * 1024
MAX_TOKEN_BYTES = 16 * 1024
# TokenReview `status.user.extra` keys a bound (projected) token carries; node claims only since
# Kubernetes 1.30 (ServiceAccountTokenPodNodeInfo), so their absence is normal.
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"
EXTRA_NODE_UID = "authentication.kubernetes.io/node-uid"
# URI SANs recording whose certificate it is; `role_from_uri` ignores any scheme but holdfast://.
POD_URI_SCHEME = "holdfast-pod"


class Reason(StrEnum):
    """Enrollment's own vocabulary (ErrorInfo reasons of holdfast.v1.Enrollment/Enroll). Kept apart
    from holdfast.common.reasons, which maps the Coordinator's reasons to `holdfast` exit codes: an
    agent, not a shell, reads these, and none of them has an exit code or a `--wait`."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"          # empty or oversize fields
    CSR_INVALID = "CSR_INVALID"                    # not a signed PKCS#10 of an EC P-256 key
    TOKEN_REJECTED = "TOKEN_REJECTED"              # the API server did not authenticate the token
    WRONG_AUDIENCE = "WRONG_AUDIENCE"
    WRONG_SERVICE_ACCOUNT = "WRONG_SERVICE_ACCOUNT"
    POD_NOT_FOUND = "POD_NOT_FOUND"                # gone, or replaced by another pod of the same name
    POD_NOT_BOUND = "POD_NOT_BOUND"                # not a running pod of the holdfast-agent DaemonSet
    NODE_MISMATCH = "NODE_MISMATCH"
    NODE_NOT_FOUND = "NODE_NOT_FOUND"
    NAMESPACE_NOT_ALLOWED = "NAMESPACE_NOT_ALLOWED"  # a session pod's namespace the issuer's table lacks
    ROLE_NOT_ALLOWED = "ROLE_NOT_ALLOWED"            # a session CSR asking for more than its client role
    ISSUER_UNAVAILABLE = "ISSUER_UNAVAILABLE"      # the API server did not answer: retry


CODES: dict[Reason, grpc.StatusCode] = {
    Reason.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.CSR_INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.ISSUER_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    **{reason: grpc.StatusCode.PERMISSION_DENIED for reason in (
        Reason.TOKEN_REJECTED, Reason.WRONG_AUDIENCE, Reason.WRONG_SERVICE_ACCOUNT, Reason.POD_NOT_FOUND,
        Reason.POD_NOT_BOUND, Reason.NODE_MISMATCH, Reason.NODE_NOT_FOUND, Reason.NAMESPACE_NOT_ALLOWED,
        Reason.ROLE_NOT_ALLOWED)},
}


@dataclass(frozen=True)
class Refusal(Exception):
    reason: Reason
    message: str

    @property
    def code(self) -> grpc.StatusCode:
        return CODES[self.reason]


@dataclass(frozen=True)
class PodClaim:
    """What an authenticated token says about its pod (and, on newer clusters, its node)."""

    pod_name: str
    pod_uid: str
    node_name: str = ""
    node_uid: str = ""


@dataclass(frozen=True)
class Identity:
    """Whom a certificate may be signed for."""

    node: str
    node_uid: str
    pod_name: str
    pod_uid: str

    def uris(self) -> list[str]:
        return [Role("agent", self.node).uri(), f"{POD_URI_SCHEME}://{self.pod_uid}",
                f"{NODE_URI_SCHEME}://{self.node_uid}"]


def check_sizes(csr_pem: bytes, token: str) -> None:
    if not csr_pem or not token:
        raise Refusal(Reason.INVALID_ARGUMENT, "both csr_pem and token are required")
    if len(csr_pem) > MAX_CSR_BYTES:
        raise Refusal(Reason.INVALID_ARGUMENT, f"csr_pem is {len(csr_pem)} bytes; at most {MAX_CSR_BYTES}")
    if len(token.encode()) > MAX_TOKEN_BYTES:
        raise Refusal(Reason.INVALID_ARGUMENT,
                      f"token is {len(token.encode())} bytes; at most {MAX_TOKEN_BYTES}")


def parse_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """A self-signed CSR of an EC P-256 key, the only kind the agent makes."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise Refusal(Reason.CSR_INVALID, f"csr_pem is not a PEM certificate request: {exc}") from None
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        kind = type(key).__name__.removeprefix("_")
        size = getattr(key, "key_size", "?")
        raise Refusal(Reason.CSR_INVALID, f"the CSR's key is {kind} ({size} bits); only EC P-256 is signed")
    if not csr.is_signature_valid:
        raise Refusal(Reason.CSR_INVALID, "the CSR's signature does not verify with its own key")
    return csr


def requested_roles(csr: x509.CertificateSigningRequest) -> list[str]:
    """The holdfast role URIs the CSR asks for (the issuer sets every other name itself)."""
    try:
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    # Any holdfast:// URI counts, a malformed one too: the issuer never signs a name it did not set.
    return [uri for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
            if uri.startswith(f"{ROLE_SCHEME}://")]


def unverified_audiences(token: str) -> list[str]:
    """The `aud` of a JWT's payload without checking anything: only to explain a refusal."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        aud = claims.get("aud", [])
    except (IndexError, ValueError, binascii.Error, AttributeError):
        return []
    return [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)]


def _first(extra: dict[str, Any], key: str) -> str:
    values = extra.get(key) or []
    return values[0] if len(values) == 1 and isinstance(values[0], str) else ""


def authenticated_user(review: dict[str, Any], token: str) -> dict[str, Any]:
    """A TokenReview answer (apis/authentication.k8s.io/v1) -> the user it authenticated for
    audience holdfast."""
    status = review.get("status") or {}
    if not status.get("authenticated"):
        error = str(status.get("error") or "not authenticated")[:300]
        audiences = unverified_audiences(token)
        if audiences and AUDIENCE not in audiences:
            raise Refusal(Reason.WRONG_AUDIENCE, f"the token is for audience(s) {audiences[:4]}, not "
                          f"{AUDIENCE!r}; mount a projected token with audience {AUDIENCE} ({error})")
        raise Refusal(Reason.TOKEN_REJECTED, f"the API server did not authenticate the token: {error}")
    if AUDIENCE not in (status.get("audiences") or []):
        raise Refusal(Reason.WRONG_AUDIENCE, f"the token was authenticated for {status.get('audiences')}, "
                      f"not audience {AUDIENCE!r}")
    return status.get("user") or {}


def pod_claim(user: dict[str, Any]) -> PodClaim:
    """The pod (and node) an authenticated bound token names."""
    extra = user.get("extra") or {}
    claim = PodClaim(_first(extra, EXTRA_POD_NAME), _first(extra, EXTRA_POD_UID),
                     _first(extra, EXTRA_NODE_NAME), _first(extra, EXTRA_NODE_UID))
    if not claim.pod_name or not claim.pod_uid:
        raise Refusal(Reason.POD_NOT_BOUND, "the token is not bound to a pod (a projected "
                      "serviceAccountToken volume gives one that is)")
    return claim


def check_review(review: dict[str, Any], token: str, namespace: str) -> PodClaim:
    """A TokenReview answer -> the holdfast-agent pod the token is bound to."""
    user = authenticated_user(review, token)
    wanted = f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    username = str(user.get("username", ""))
    if username != wanted:
        raise Refusal(Reason.WRONG_SERVICE_ACCOUNT, f"the token is {username[:253]!r}'s; only {wanted!r} "
                      "(the holdfast-agent DaemonSet's service account) may enroll")
    return pod_claim(user)


def found_pod(pod: dict[str, Any] | None, claim: PodClaim) -> dict[str, Any]:
    """The pod read by name (None: 404) -> the pod, if it is the one the token is bound to."""
    if pod is None:
        raise Refusal(Reason.POD_NOT_FOUND, f"pod {claim.pod_name!r} the token is bound to does not exist")
    meta = pod.get("metadata") or {}
    if meta.get("uid") != claim.pod_uid:
        raise Refusal(Reason.POD_NOT_FOUND, f"pod {claim.pod_name!r} (uid {claim.pod_uid}) is gone; a pod "
                      f"of that name now has uid {meta.get('uid')}")
    return pod


def check_pod(pod: dict[str, Any] | None, claim: PodClaim) -> str:
    """The pod read by name (None: 404) -> the node it runs on."""
    found = found_pod(pod, claim)
    meta = found.get("metadata") or {}
    owners = [(o.get("kind"), o.get("name")) for o in meta.get("ownerReferences") or []
              if o.get("controller", True)]
    if ("DaemonSet", DAEMONSET) not in owners:
        raise Refusal(Reason.POD_NOT_BOUND, f"pod {claim.pod_name!r} is owned by {owners[:4]}, not the "
                      f"DaemonSet {DAEMONSET!r}")
    return running_node(found, claim)


def running_node(pod: dict[str, Any], claim: PodClaim) -> str:
    """The node a Running pod is on, if it is the node the token names (when it names one)."""
    phase = (pod.get("status") or {}).get("phase")
    if phase != "Running":
        raise Refusal(Reason.POD_NOT_BOUND, f"pod {claim.pod_name!r} is {phase}, not Running")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        raise Refusal(Reason.POD_NOT_BOUND, f"pod {claim.pod_name!r} is not scheduled to a node")
    if claim.node_name and claim.node_name != node:
        raise Refusal(Reason.NODE_MISMATCH, f"the token names node {claim.node_name!r} but pod "
                      f"{claim.pod_name!r} runs on {node!r}")
    return node


def check_node(node_obj: dict[str, Any] | None, node: str, claim: PodClaim) -> str:
    """The node read by name (None: 404) -> its uid."""
    if node_obj is None:
        raise Refusal(Reason.NODE_NOT_FOUND, f"node {node!r} does not exist")
    uid = str((node_obj.get("metadata") or {}).get("uid") or "")
    if claim.node_uid and claim.node_uid != uid:
        raise Refusal(Reason.NODE_MISMATCH, f"the token names node uid {claim.node_uid} but node {node!r} "
                      f"has uid {uid}: the node was replaced")
    return uid


def check_csr_role(csr: x509.CertificateSigningRequest, node: str) -> None:
    """A CSR may leave its role to the issuer, or ask for exactly this node's agent role."""
    wanted = Role("agent", node).uri()
    asked = requested_roles(csr)
    if any(uri != wanted for uri in asked):
        raise Refusal(Reason.NODE_MISMATCH, f"the CSR asks for {asked[:4]} but the token's pod runs on "
                      f"node {node!r}: only {wanted} can be signed")
