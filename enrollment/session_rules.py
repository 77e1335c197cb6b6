"""What a session pod's enrollment must prove before the issuer signs it a certificate. Pure: no I/O.

Guarantee: a session certificate is admitted only for a token the API server authenticated
(TokenReview) for audience `holdfast`, of a ServiceAccount whose namespace the configured table
(`SessionPolicy`) allows, bound to a pod that still exists with the token's uid, runs that very
ServiceAccount, is Running, and sits on a node that exists — the node the token names, and the one
the request says, when they name one. What is signed is decided here and nowhere else: exactly
`holdfast://client`, the namespace's tenant, and the ServiceAccount's SPIFFE-like id; a CSR asking
for any other role or tenant is refused, never narrowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from holdfast.common.tls import TENANT, TENANT_SCHEME, Role
from holdfast.enrollment.issuer_rules import (
    POD_URI_SCHEME,
    PodClaim,
    Reason,
    Refusal,
    authenticated_user,
    pod_claim,
    requested_roles,
)

SPIFFE_SCHEME = "spiffe"
DEFAULT_TRUST_DOMAIN = "cluster.local"
ANY_NAMESPACE = "*"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# A trust domain is a DNS name (SPIFFE ID spec §2.1); a ServiceAccount name a DNS subdomain.
DNS_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class SessionPolicy:
    """Which namespaces' pods may enroll, and the tenant each one's certificates name.

    `tenants` maps a namespace to its tenant; `any_namespace` lets every other namespace enroll as
    its own tenant, except `own_namespace` (holdfast's: its pods are infrastructure, not a tenant)
    and a namespace named like a tenant that is not simply its own: the coordinator's
    `default_tenant` (its pods would act on every session recorded before tenants and every
    client's whose certificate names none; Kubernetes' own `default` namespace, where anyone with a
    pod may be), or one the table gives other namespaces (`team-b=shared`: a namespace someone
    names `shared` would join team-b). The table may still name it explicitly.
    """

    tenants: Mapping[str, str] = field(default_factory=dict)
    any_namespace: bool = False
    own_namespace: str = ""
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    default_tenant: str = "default"

    def tenant(self, namespace: str) -> str:
        if namespace in self.tenants:
            return self.tenants[namespace]
        taken = namespace == self.default_tenant or namespace in self.tenants.values()
        if self.any_namespace and namespace != self.own_namespace and not taken:
            return namespace
        allowed = sorted(self.tenants)[:8] + ([ANY_NAMESPACE] if self.any_namespace else [])
        unless = ("; `*` never admits a namespace named like the default tenant or a tenant of other "
                  "namespaces: list it to mean it" if self.any_namespace and taken else "")
        raise Refusal(Reason.NAMESPACE_NOT_ALLOWED, f"pods of namespace {namespace[:63]!r} may not enroll "
                      f"for session certificates (allowed: {allowed or 'none'}; the coordinator's "
                      f"session_namespaces setting{unless})")


def parse_namespaces(text: str, own_namespace: str = "", trust_domain: str = DEFAULT_TRUST_DOMAIN,
                     default_tenant: str = "default") -> SessionPolicy:
    """`team-a, team-b=shared, *`: entries split by commas or spaces, each a namespace enrolling as
    its own tenant, `namespace=tenant`, or `*` for every namespace as its own tenant. ValueError
    names a malformed or repeated entry."""
    if not DNS_NAME.fullmatch(trust_domain):
        raise ValueError(f"trust domain {trust_domain[:80]!r} is not a lowercase DNS name")
    tenants: dict[str, str] = {}
    any_namespace = False
    for entry in text.replace(",", " ").split():
        if entry == ANY_NAMESPACE:
            any_namespace = True
            continue
        namespace, mapped, tenant = entry.partition("=")
        tenant = tenant if mapped else namespace
        for name in (namespace, tenant):
            if not TENANT.fullmatch(name):
                raise ValueError(f"{entry[:80]!r}: {name[:80]!r} is not a DNS label ({TENANT.pattern})")
        if namespace in tenants:
            raise ValueError(f"namespace {namespace!r} is listed twice")
        tenants[namespace] = tenant
    return SessionPolicy(tenants, any_namespace, own_namespace, trust_domain, default_tenant)


@dataclass(frozen=True)
class SessionClaim:
    """Whose token it is: a ServiceAccount, and the pod it is bound to."""

    namespace: str
    service_account: str
    pod: PodClaim


@dataclass(frozen=True)
class SessionIdentity:
    """Whom a session certificate is signed for."""

    tenant: str
    spiffe_id: str
    pod_uid: str
    node: str

    def uris(self) -> list[str]:
        return [Role("client", tenant=self.tenant).uri(), Role("client", tenant=self.tenant).tenant_uri(),
                self.spiffe_id, f"{POD_URI_SCHEME}://{self.pod_uid}"]


def check_review(review: dict[str, Any], token: str) -> SessionClaim:
    """A TokenReview answer -> the ServiceAccount and pod the token is bound to."""
    user = authenticated_user(review, token)
    username = str(user.get("username", ""))
    namespace, _, service_account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    if (not username.startswith(SERVICE_ACCOUNT_PREFIX) or not TENANT.fullmatch(namespace)
            or not DNS_NAME.fullmatch(service_account)):
        raise Refusal(Reason.WRONG_SERVICE_ACCOUNT, f"the token is {username[:253]!r}'s, not a "
                      "ServiceAccount's (system:serviceaccount:<namespace>:<name>)")
    return SessionClaim(namespace, service_account, pod_claim(user))


def check_pod(pod: dict[str, Any], claim: SessionClaim, said_node: str) -> None:
    """The pod (found_pod's, running_node's checks done) runs the token's ServiceAccount, on the
    node the request says it does."""
    runs = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
    if runs != claim.service_account:
        raise Refusal(Reason.WRONG_SERVICE_ACCOUNT, f"pod {claim.pod.pod_name!r} runs as ServiceAccount "
                      f"{runs!r}, not the token's {claim.service_account!r}")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if said_node and said_node != node:
        raise Refusal(Reason.NODE_MISMATCH, f"the request says node {said_node[:253]!r} but pod "
                      f"{claim.pod.pod_name!r} runs on {node!r} (HOLDFAST_HOST_ID must be the pod's "
                      "spec.nodeName)")


def spiffe_id(trust_domain: str, claim: SessionClaim) -> str:
    return f"{SPIFFE_SCHEME}://{trust_domain}/ns/{claim.namespace}/sa/{claim.service_account}"


def check_csr(csr: x509.CertificateSigningRequest, tenant: str) -> None:
    """A CSR may leave its names to the issuer, or ask for exactly the client role and this tenant."""
    wanted = {Role("client").uri(), Role("client", tenant=tenant).tenant_uri()}
    try:
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    asked = [*requested_roles(csr), *(uri for uri in uris if uri.startswith(f"{TENANT_SCHEME}:"))]
    if any(uri not in wanted for uri in asked):
        raise Refusal(Reason.ROLE_NOT_ALLOWED, f"the CSR asks for {asked[:4]}; a session pod of tenant "
                      f"{tenant!r} is signed {sorted(wanted)} and nothing else")
