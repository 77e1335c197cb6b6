"""The pure rules of a session pod's enrollment (enrollment/session_rules.py), on the API reference's
JSON shapes: whose token it is, what its pod must be, what a CSR may ask for, what is signed."""

from __future__ import annotations

from typing import Any

import pytest

from holdfast.common import certs
from holdfast.common.tls import Role
from holdfast.enrollment import issuer_rules, session_rules
from holdfast.enrollment.issuer_rules import Reason, Refusal


def review(username: str, pod: str = "session-1", uid: str = "u-1") -> dict[str, Any]:
    extra = {issuer_rules.EXTRA_POD_NAME: [pod], issuer_rules.EXTRA_POD_UID: [uid]} if pod else {}
    return {"status": {"authenticated": True, "audiences": ["holdfast"],
                       "user": {"username": username, "extra": extra}}}


def test_only_a_service_accounts_token_bound_to_a_pod_names_a_namespace() -> None:
    claim = session_rules.check_review(review("system:serviceaccount:team-a:runner"), "t")
    assert (claim.namespace, claim.service_account, claim.pod.pod_name) == ("team-a", "runner", "session-1")
    for username in ("system:node:node-1", "alice", "system:serviceaccount:Team-A:runner",
                     "system:serviceaccount:team-a:", "system:serviceaccount::runner"):
        with pytest.raises(Refusal) as refused:
            session_rules.check_review(review(username), "t")
        assert refused.value.reason == Reason.WRONG_SERVICE_ACCOUNT, username
    with pytest.raises(Refusal) as unbound:
        session_rules.check_review(review("system:serviceaccount:team-a:runner", pod=""), "t")
    assert unbound.value.reason == Reason.POD_NOT_BOUND


def pod(service_account: str | None = "runner", node: str = "node-1") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node}
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    return {"metadata": {"uid": "u-1"}, "spec": spec, "status": {"phase": "Running"}}


def test_the_pod_runs_the_tokens_service_account_on_the_node_the_request_says() -> None:
    claim = session_rules.check_review(review("system:serviceaccount:team-a:runner"), "t")
    session_rules.check_pod(pod(), claim, "node-1")
    session_rules.check_pod(pod(), claim, "")  # a request may leave the node to the pod
    for bad, reason in [(pod("deployer"), Reason.WRONG_SERVICE_ACCOUNT),
                        (pod(None), Reason.WRONG_SERVICE_ACCOUNT),  # no name: the namespace's `default`
                        (pod(node="node-2"), Reason.NODE_MISMATCH)]:
        with pytest.raises(Refusal) as refused:
            session_rules.check_pod(bad, claim, "node-1")
        assert refused.value.reason == reason


def test_a_csr_asks_for_nothing_or_exactly_its_client_role_and_tenant() -> None:
    def csr(role: Role) -> Any:
        from cryptography import x509

        return x509.load_pem_x509_csr(certs.key_and_csr(role)[1])

    session_rules.check_csr(csr(Role("client")), "team-a")
    for asked in (Role("operator"), Role("agent", "node-1"), Role("maintenance"), Role("coordinator")):
        with pytest.raises(Refusal) as refused:
            session_rules.check_csr(csr(asked), "team-a")
        assert refused.value.reason == Reason.ROLE_NOT_ALLOWED


def test_what_is_signed_is_the_client_role_its_tenant_and_its_spiffe_id() -> None:
    claim = session_rules.check_review(review("system:serviceaccount:team-b:runner"), "t")
    policy = session_rules.parse_namespaces("team-b=shared", "holdfast", "example.org")
    spiffe = session_rules.spiffe_id(policy.trust_domain, claim)
    assert spiffe == "spiffe://example.org/ns/team-b/sa/runner"
    identity = session_rules.SessionIdentity(policy.tenant(claim.namespace), spiffe, "u-1", "node-1")
    assert identity.uris() == ["holdfast://client", "holdfast-tenant://shared", spiffe, "holdfast-pod://u-1"]
