"""The issuer's rules as pure functions of the API server's JSON: each way to fail names its reason."""

from __future__ import annotations

import base64
import json

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from holdfast.enrollment import issuer_rules as rules

NS = "holdfast"
CLAIM = rules.PodClaim("holdfast-agent-abc", "pod-uid", "", "")


def review(**status: object) -> dict:
    base = {"authenticated": True, "audiences": ["holdfast"],
            "user": {"username": f"system:serviceaccount:{NS}:holdfast-agent",
                     "extra": {rules.EXTRA_POD_NAME: [CLAIM.pod_name], rules.EXTRA_POD_UID: [CLAIM.pod_uid]}}}
    return {"status": {**base, **status}}


def pod(**changes: object) -> dict:
    owner = {"kind": "DaemonSet", "name": "holdfast-agent", "controller": True}
    obj = {"metadata": {"name": CLAIM.pod_name, "uid": CLAIM.pod_uid, "ownerReferences": [owner]},
           "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}}
    for path, value in changes.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


def jwt(aud: list[str]) -> str:
    body = base64.urlsafe_b64encode(json.dumps({"aud": aud}).encode()).rstrip(b"=").decode()
    return f"e30.{body}.sig"


def refusal(fn, *args) -> rules.Refusal:  # type: ignore[no-untyped-def]
    with pytest.raises(rules.Refusal) as raised:
        fn(*args)
    return raised.value


def test_an_authenticated_agent_token_names_its_pod() -> None:
    assert rules.check_review(review(), "t", NS) == CLAIM
    assert rules.check_pod(pod(), CLAIM) == "node-1"
    assert rules.check_node({"metadata": {"uid": "n-uid"}}, "node-1", CLAIM) == "n-uid"


@pytest.mark.parametrize(("status", "token", "reason"), [
    ({"authenticated": False, "error": "expired"}, "garbage", "TOKEN_REJECTED"),
    ({"authenticated": False, "error": "audience"}, jwt(["vault"]), "WRONG_AUDIENCE"),
    ({"audiences": ["other"]}, "t", "WRONG_AUDIENCE"),
    ({"user": {"username": "system:serviceaccount:default:holdfast-agent"}}, "t", "WRONG_SERVICE_ACCOUNT"),
    ({"user": {"username": f"system:serviceaccount:{NS}:holdfast-agent", "extra": {}}}, "t", "POD_NOT_BOUND"),
])
def test_reviews_that_prove_no_agent_pod_are_refused(status: dict, token: str, reason: str) -> None:
    got = refusal(rules.check_review, review(**status), token, NS)
    assert got.reason == reason and got.code == grpc.StatusCode.PERMISSION_DENIED and got.message


@pytest.mark.parametrize(("obj", "claim", "reason"), [
    (None, CLAIM, "POD_NOT_FOUND"),
    (pod(metadata__uid="other"), CLAIM, "POD_NOT_FOUND"),
    (pod(metadata__ownerReferences=[{"kind": "ReplicaSet", "name": "x"}]), CLAIM, "POD_NOT_BOUND"),
    (pod(status__phase="Succeeded"), CLAIM, "POD_NOT_BOUND"),
    (pod(spec__nodeName=""), CLAIM, "POD_NOT_BOUND"),
    (pod(), rules.PodClaim(CLAIM.pod_name, CLAIM.pod_uid, "node-2", "u"), "NODE_MISMATCH"),
])
def test_pods_that_are_not_a_running_daemonset_agent_are_refused(obj: dict | None, claim: rules.PodClaim,
                                                                  reason: str) -> None:
    assert refusal(rules.check_pod, obj, claim).reason == reason


def test_a_missing_or_replaced_node_is_refused() -> None:
    assert refusal(rules.check_node, None, "node-1", CLAIM).reason == "NODE_NOT_FOUND"
    claim = rules.PodClaim(CLAIM.pod_name, CLAIM.pod_uid, "node-1", "old-uid")
    assert refusal(rules.check_node, {"metadata": {"uid": "new"}}, "node-1", claim).reason == "NODE_MISMATCH"


def _csr(uris: list[str]) -> x509.CertificateSigningRequest:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
    if uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), critical=False)
    return builder.sign(key, hashes.SHA256())


def test_a_csr_asks_for_its_own_nodes_role_or_none() -> None:
    rules.check_csr_role(_csr([]), "node-1")
    rules.check_csr_role(_csr(["holdfast://agent/node-1"]), "node-1")
    for uris in (["holdfast://agent/node-2"], ["holdfast://operator"], ["holdfast://agent/node-1",
                                                                        "holdfast://coordinator"]):
        got = refusal(rules.check_csr_role, _csr(uris), "node-1")
        assert got.reason == "NODE_MISMATCH" and "node-1" in got.message


def test_csr_parsing_takes_only_signed_p256_requests() -> None:
    pem = _csr([]).public_bytes(serialization.Encoding.PEM)
    assert rules.parse_csr(pem)
    assert refusal(rules.parse_csr, b"junk").reason == "CSR_INVALID"
    assert refusal(rules.check_sizes, b"", "t").code == grpc.StatusCode.INVALID_ARGUMENT
    assert refusal(rules.check_sizes, pem, "x" * (rules.MAX_TOKEN_BYTES + 1)).reason == "INVALID_ARGUMENT"


def test_every_reason_has_a_status_code() -> None:
    assert set(rules.CODES) == set(rules.Reason)


def test_any_namespace_never_enrolls_a_pod_as_the_default_tenant() -> None:
    from holdfast.enrollment import session_rules

    # `*` makes every namespace its own tenant; Kubernetes' own `default` namespace (or one named
    # like the configured default tenant) would then hold every session recorded before tenants
    # and every client certificate's naming none.
    policy = session_rules.parse_namespaces("*", "holdfast", default_tenant="default")
    assert policy.tenant("team-z") == "team-z"
    with pytest.raises(rules.Refusal):
        policy.tenant("default")
    legacy = session_rules.parse_namespaces("*", "holdfast", default_tenant="legacy")
    assert legacy.tenant("default") == "default"
    with pytest.raises(rules.Refusal):
        legacy.tenant("legacy")
    # Named in the table, it is the operator's explicit choice.
    assert session_rules.parse_namespaces("ops=default, *", "holdfast",
                                          default_tenant="default").tenant("ops") == "default"


def test_any_namespace_never_joins_a_tenant_the_table_gives_other_namespaces() -> None:
    from holdfast.enrollment import session_rules

    # `team-b=shared`: tenant `shared` is team-b's. A namespace someone names `shared` must not
    # join it through `*`; listed itself, it is the operator's choice.
    policy = session_rules.parse_namespaces("team-b=shared, *", "holdfast")
    assert policy.tenant("team-b") == "shared" and policy.tenant("team-z") == "team-z"
    with pytest.raises(rules.Refusal):
        policy.tenant("shared")
    assert session_rules.parse_namespaces("team-b=shared, shared, *", "holdfast").tenant("shared") == "shared"
