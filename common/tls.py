"""mTLS for holdfast's gRPC links, and the role a peer's CA-signed certificate gives it.

Each certificate carries exactly one role as a URI SAN, `holdfast://<kind>[/<name>]`
(`coordinator`, `client`, `agent/<host_id>`, `operator`, `maintenance`; docs/design.md §4), and at
most one tenant as another, `holdfast-tenant://<tenant>` (`holdfast-tenant://*`: every tenant, for
an operator alone; docs/tenants.md). A server reads both from the verified peer certificate in the
gRPC auth context, never from a request: without TLS there is no role at all, and an ambiguous
certificate (two roles, two tenants, a malformed tenant, all tenants on a runtime's) has none.

Guarantee: a key, certificate or CA bundle is read only through files.open_tls_dir and
files.read_tls_file: never another user's file, link or FIFO, nor from a directory another user may
change (one others may write without its sticky bit stands for its private `holdfast-<uid>`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from holdfast.common import env, files, keepalive

if TYPE_CHECKING:
    from cryptography import x509

ROLE_SCHEME = "holdfast"
TENANT_SCHEME = "holdfast-tenant"
ALL_TENANTS = "*"  # an operator's scope over every tenant; only `certs issue --all-tenants` writes it
# A tenant is a DNS label, as a Kubernetes namespace is: a session pod's namespace can name its tenant.
TENANT = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# The Kubernetes Node an enrolled agent's certificate was signed for: the issuer writes its uid (read
# from the API server) as `holdfast-node://<uid>`. A uid is a UUID; anything else is no uid at all.
NODE_URI_SCHEME = "holdfast-node"
NODE_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# `etcd` is only ever issued by the separate etcd CA (`<tls dir>/etcd/`), which holdfast's servers
# do not trust: a client or agent certificate must never reach etcd and write around the fences.
# `client` is a runtime; `operator` overrides evidence or touches every session; `maintenance` runs
# retention only (the purge CronJob). A runtime key never carries operator powers.
ROLE_KINDS = ("coordinator", "client", "agent", "etcd", "operator", "maintenance")
ETCD_SUBDIR = "etcd"
# The enrollment issuer's CA (docs/decisions.md): servers trust it beside ca.pem, but a certificate
# it issued carries an agent role or none. gRPC has verified the chain before a role is read, and
# only ca.pem and this CA are trusted, so the issuer name tells which of the two signed it.
AGENT_CA_STEM = "agent-ca"
AGENT_CA_NAME = "holdfast agent CA (agent roles only)"
# The session CA, the issuer's key for session pods (docs/tenants.md): a certificate it issued is a
# runtime of exactly one tenant or nothing, so a pod's token can never mint an operator, an agent,
# a maintenance job, a coordinator or an all-tenants identity, whatever SANs a CSR smuggled in.
SESSION_CA_STEM = "session-ca"
SESSION_CA_NAME = "holdfast session CA (one tenant's client role only)"


@dataclass(frozen=True)
class Role:
    """What a peer certificate says it is: `agent` carries the host id it may speak for; `tenant`
    the tenant whose sessions it acts on ("" when the certificate names none: the coordinator's
    default tenant; ALL_TENANTS for an operator over every tenant)."""

    kind: str
    name: str = ""
    tenant: str = ""

    def uri(self) -> str:
        return f"{ROLE_SCHEME}://{self.kind}/{self.name}" if self.name else f"{ROLE_SCHEME}://{self.kind}"

    def tenant_uri(self) -> str:
        return f"{TENANT_SCHEME}://{self.tenant}" if self.tenant else ""

    @property
    def file_stem(self) -> str:
        return f"{self.kind}-{self.name}" if self.name else self.kind


def role_from_uri(uri: str) -> Role | None:
    """The role a certificate URI names, or None for anything that is not exactly a holdfast role."""
    prefix = f"{ROLE_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    kind, _, name = uri[len(prefix):].partition("/")
    if kind not in ROLE_KINDS or (kind == "agent") != bool(name) or "/" in name:
        return None
    return Role(kind, name)


def role_of_certificate(cert: x509.Certificate) -> Role | None:
    # Imported here, not above: only servers read certificates, and x509 costs a runtime's `run`
    # a fifth of its start (docs/benchmarks.md) for a channel that never needs it.
    from cryptography import x509

    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    roles = {role for role in map(role_from_uri, uris) if role is not None}
    # Any case of the scheme (it is case-blind): a tenant SAN read as none would act for the default
    # tenant; `tenant_from_uri` then accepts only the exact form.
    tenants = [uri for uri in uris if uri.lower().startswith(f"{TENANT_SCHEME}:")]
    # A certificate claiming two roles, or two tenants, is ambiguous; ambiguity grants nothing.
    if len(roles) != 1 or len(tenants) > 1:
        return None
    role = roles.pop()
    if tenants:
        tenant = tenant_from_uri(tenants[0])
        if tenant is None or (tenant == ALL_TENANTS and role.kind != "operator"):
            return None
        role = Role(role.kind, role.name, tenant)
    return role if issuer_admits(cert, role) else None


def tenant_from_uri(uri: str) -> str | None:
    """The tenant a `holdfast-tenant://` URI names, or None for one that is not exactly that."""
    prefix = f"{TENANT_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    tenant = uri[len(prefix):]
    return tenant if tenant == ALL_TENANTS or TENANT.fullmatch(tenant) else None


def issuer_admits(cert: x509.Certificate, role: Role) -> bool:
    """Whether the CA that signed `cert` may give `role`: the agent CA agent roles only, the session
    CA a client of one named tenant only, ca.pem any role."""
    from cryptography import x509  # as in role_of_certificate

    names = {name.value for name in cert.issuer.get_attributes_for_oid(x509.NameOID.COMMON_NAME)}
    if AGENT_CA_NAME in names:
        return role.kind == "agent"
    if SESSION_CA_NAME in names:
        return role.kind == "client" and bool(role.tenant) and role.tenant != ALL_TENANTS
    return True


def peer_role(context: grpc.aio.ServicerContext) -> Role | None:
    """The verified peer's role, or None on a plaintext link, a certificate without one role, or one
    past its notAfter. gRPC checks validity only at the handshake: a connection opened before the
    certificate expired would otherwise keep its role for as long as keepalive holds it open."""
    pems = context.auth_context().get("x509_pem_cert", [])
    if len(pems) != 1:
        return None
    role, not_after = _role_of_pem(pems[0])
    return role if not _lapsed(not_after) else None


def peer_expired(context: grpc.aio.ServicerContext) -> bool:
    """Whether the verified peer certificate is past its notAfter (False on a plaintext link)."""
    pems = context.auth_context().get("x509_pem_cert", [])
    return len(pems) == 1 and _lapsed(_role_of_pem(pems[0])[1])


def _lapsed(not_after: float) -> bool:
    # The wall clock, unlike anywhere else in holdfast: a certificate's validity is defined in wall-
    # clock time (X.509 notAfter), and this answers whether a credential still speaks, never whether
    # a process or host is alive.
    return time.time() >= not_after


@functools.lru_cache(maxsize=4096)
def _role_of_pem(pem: bytes) -> tuple[Role | None, float]:
    """The role of a certificate and its notAfter (epoch seconds), kept by its bytes (what it says
    depends on nothing else): a parse costs ~30 µs, and a caller presents the same certificate on
    every call, read by the role gate, the tenancy check and the call limits alike."""
    from cryptography import x509  # as in role_of_certificate

    cert = x509.load_pem_x509_certificate(pem)
    return role_of_certificate(cert), cert.not_valid_after_utc.timestamp()


def peer_node_uid(context: grpc.aio.ServicerContext) -> str:
    """The Node uid in the verified peer certificate ("" on a plaintext link, or with none or two):
    what the issuer checked with the API server when it signed, never what a request says."""
    pems = context.auth_context().get("x509_pem_cert", [])
    if len(pems) != 1:
        return ""
    from cryptography import x509  # as in role_of_certificate

    try:
        sans = x509.load_pem_x509_certificate(pems[0]).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    prefix = f"{NODE_URI_SCHEME}://"
    uids = [uri[len(prefix):] for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
            if uri.startswith(prefix)]
    return uids[0] if len(uids) == 1 and NODE_UID.fullmatch(uids[0]) else ""


@dataclass(frozen=True)
class Files:
    """A role's key, certificate and trust bundle as read at once from one TLS directory."""

    key_pem: bytes
    cert_pem: bytes
    trust_pem: bytes


def _read(directory: int, where: str, name: str, secret: bool = False) -> bytes:
    try:
        return files.read_tls_file(directory, where, name, secret)
    except FileNotFoundError:
        missing = os.path.join(where, name)
        raise FileNotFoundError(f"{missing} is missing; make it with `holdfast certs init`") from None


def _bundle(directory: int, where: str) -> bytes:
    """ca.pem, plus agent-ca.pem and session-ca.pem where they are (read as `_read` reads)."""
    extra = b""
    for stem in (AGENT_CA_STEM, SESSION_CA_STEM):
        with contextlib.suppress(FileNotFoundError):
            extra += files.read_tls_file(directory, where, f"{stem}.pem")
    return _read(directory, where, "ca.pem") + extra


def read_files(directory: Path, role: Role | None = None) -> Files:
    """`role`'s key and certificate (none without one) and the trust bundle, each read from the
    directory open_tls_dir opens (through no link another user made or may swap; another user's
    file, a FIFO, a key others may read is refused: files.read_tls_file)."""
    fd, where = files.open_tls_dir(directory)
    try:
        key = _read(fd, where, f"{role.file_stem}.key", secret=True) if role is not None else b""
        cert = _read(fd, where, f"{role.file_stem}.pem") if role is not None else b""
        return Files(key, cert, _bundle(fd, where))
    finally:
        os.close(fd)


def read_file(path: Path, secret: bool = False) -> bytes:
    """One TLS file named by its path (HOLDFAST_ENROLL_CA), read as read_files reads the files of
    its directory."""
    fd, where = files.open_tls_dir(path.parent)
    try:
        return files.read_tls_file(fd, where, path.name, secret)
    finally:
        os.close(fd)


def files_dir(directory: Path) -> Path:
    """The directory `directory`'s TLS files are in (files.open_tls_dir: itself, or its private
    `holdfast-<uid>` where others may write it), or `directory` when it cannot be opened now."""
    try:
        fd, where = files.open_tls_dir(directory)
    except OSError:
        return directory
    os.close(fd)
    return Path(where)


def trust_bundle(directory: Path) -> bytes:
    """ca.pem, plus agent-ca.pem and session-ca.pem where they are: enrolled agents' and session
    pods' certificates come from those."""
    return read_files(directory).trust_pem


def server_credentials(directory: Path, role: Role) -> grpc.ServerCredentials:
    """Serves with `role`'s certificate and requires every client to present one from a trusted CA."""
    read = read_files(directory, role)
    return grpc.ssl_server_credentials([(read.key_pem, read.cert_pem)], root_certificates=read.trust_pem,
                                       require_client_auth=True)


def channel_credentials(directory: Path, role: Role) -> grpc.ChannelCredentials:
    read = read_files(directory, role)
    return grpc.ssl_channel_credentials(root_certificates=read.trust_pem, private_key=read.key_pem,
                                        certificate_chain=read.cert_pem)


def tls_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The certificate directory: the explicit option, else $HOLDFAST_TLS_DIR, else None (plaintext)."""
    chosen = explicit or os.environ.get(env.TLS_DIR)
    return Path(chosen) if chosen else None


def open_channel(target: str, directory: Path | None, role: Role, server_name: str = "",
                 options: Sequence[tuple[str, object]] = (), sync: bool = False) -> grpc.aio.Channel:
    """A channel presenting `role`'s certificate when `directory` is set, plaintext otherwise, with
    holdfast's keepalive (holdfast.common.keepalive).

    `server_name` is the name the server's certificate must carry when it is not the target's
    host (the coordinator reaches agent H at whatever address H registered, but accepts only a
    certificate issued for H, so a registration cannot point it at another host's agent).
    """
    module = grpc if sync else grpc.aio
    opts = [*keepalive.channel_options(), *options]
    if directory is None:
        return module.insecure_channel(target, options=opts)  # type: ignore[no-any-return]
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return module.secure_channel(target, channel_credentials(directory, role), options=opts)  # type: ignore[no-any-return]
