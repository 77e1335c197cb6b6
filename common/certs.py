"""A local certificate authority for holdfast's mTLS, with each party's role inside its certificate.

A certificate names its role in a URI subject alternative name (see `holdfast.common.tls`). Roles
come from the CA's signature, never from a request field: an agent certificate naming host H is
the only thing that may register H, and a client certificate can never pass for an agent's.
Private keys are written 0600.

Guarantee: every file is written whole into a directory opened once — this user's, nobody else may
write it, reached through no link another user made or may swap (files.open_private_path) — by
files.write_whole, through no link planted at its name: `certs init DIR` or `certs issue --out
DIR` into another user's directory, or one others may change, is refused, writing nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from holdfast.common import config, files, tls
from holdfast.common.identifiers import AGENT_NAMESPACE, agent_server_name
from holdfast.common.tls import (
    AGENT_CA_NAME,
    AGENT_CA_STEM,
    ALL_TENANTS,
    ETCD_SUBDIR,
    SESSION_CA_NAME,
    SESSION_CA_STEM,
    TENANT,
    Role,
)

CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=365)
# Valid from a little before now, so a peer whose clock runs behind ours accepts it at once.
BACKDATE = datetime.timedelta(minutes=5)


class ReservedName(ValueError):
    """A serve-on name under AGENT_NAMESPACE: only an agent's own certificate may carry one."""


def check_serve_on(names: list[str]) -> None:
    """Refuses (ReservedName) a serve-on name in the agents' namespace, in any case or with a root
    dot or a wildcard (name matching is case-blind), before anything is written."""
    for name in names:
        folded = name.lower().rstrip(".")
        if folded == AGENT_NAMESPACE or folded.endswith(f".{AGENT_NAMESPACE}"):
            raise ReservedName(f"serve-on name {name[:80]!r}: names under {AGENT_NAMESPACE} are agents' "
                               f"own (agent H's certificate carries H.{AGENT_NAMESPACE} alone)")


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@contextlib.contextmanager
def _opened(directory: Path, mode: int = 0o755) -> Iterator[int]:
    """A descriptor on `directory`, made (`mode`) if missing, every file of it written through:
    refused (NotPrivate, UntrustedLink) when another user could change what is there or how it is
    reached, where a link of theirs would take a root `certs` run's writes anywhere."""
    fd = files.open_private_path(directory, mode=mode)
    try:
        yield fd
    finally:
        os.close(fd)


def open_enrolled_dir(directory: Path) -> tuple[int, Path]:
    """A descriptor on the directory an enrolled key and certificates are written into, and its
    path (files.open_tls_dir): `directory`, made 0700 if missing (its parents too, never in a
    directory another user may change), reached through no link another user made or could swap;
    or, where others may write `directory` without the sticky bit — a pod's memory-backed emptyDir,
    0777 (root's) or 2777 (fsGroup's) — its subdirectory `holdfast-<uid>`, made 0700, where no other
    user can rename their ca.pem over ours. Written only through this descriptor (files.write_whole,
    files.open_private_file), and read back only as tls.read_files reads."""
    fd, where = files.open_tls_dir(directory, make=True)
    return fd, Path(where)


def _write_pair(directory: int, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    """`<stem>.key` (0600) and `<stem>.pem` (0644) in the directory open as `directory`, each whole."""
    files.write_whole(directory, f"{stem}.key", _key_pem(key), 0o600)
    files.write_whole(directory, f"{stem}.pem", _cert_pem(cert), 0o644)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             lifetime: datetime.timedelta,
             backdate: datetime.timedelta = BACKDATE) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - backdate)
            .not_valid_after(now + lifetime))


def init_ca(directory: Path, stem: str = "ca", common_name: str = "holdfast local CA") -> None:
    """Creates <stem>.pem / <stem>.key in `directory`, refusing to overwrite an existing CA."""
    with _opened(directory) as fd:
        if files.exists_at(fd, f"{stem}.key"):
            raise FileExistsError(f"{directory / (stem + '.key')} exists; use another directory or delete it")
        _write_pair(fd, stem, *_new_ca(common_name))


def _new_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new CA's key and self-signed certificate: it signs certificates, never another CA."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (_builder(common_name, name, key.public_key(), CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def init_agent_ca(directory: Path) -> None:
    """The agent CA (agent-ca.pem/.key): the enrollment issuer's only key. Servers accept its
    certificates for agent roles alone (holdfast.common.tls), so even a stolen issuer key can mint
    nothing but agents, and path length 0 keeps it from making another CA."""
    init_ca(directory, AGENT_CA_STEM, AGENT_CA_NAME)


def init_session_ca(directory: Path) -> None:
    """The session CA (session-ca.pem/.key), with which the issuer signs session pods' certificates.
    Servers accept its certificates only as a client of one tenant (holdfast.common.tls): a stolen
    key mints runtimes, never agents or operators."""
    init_ca(directory, SESSION_CA_STEM, SESSION_CA_NAME)


def load_ca(directory: Path, stem: str = "ca") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = serialization.load_pem_private_key(tls.read_file(directory / f"{stem}.key", secret=True),
                                             password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / (stem + '.key')} is not an EC key made by `holdfast certs init`")
    return key, x509.load_pem_x509_certificate(tls.read_file(directory / f"{stem}.pem"))


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, subject: str,
          public_key: ec.EllipticCurvePublicKey, names: list[x509.GeneralName],
          lifetime: datetime.timedelta, backdate: datetime.timedelta = BACKDATE) -> x509.Certificate:
    return (_builder(subject, ca_cert.subject, public_key, lifetime, backdate)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))


def key_and_csr(role: Role) -> tuple[bytes, bytes]:
    """A new EC P-256 key (PEM, PKCS#8) and a CSR asking for `role` only: what an enrolling agent or
    session pod sends; the key never leaves its process but to its own TLS directory."""
    key = _new_key()
    uri = role.uri()
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri)]))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
           .sign(key, hashes.SHA256()))
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


def sign_agent(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
               public_key: ec.EllipticCurvePublicKey, node: str, uris: list[str],
               lifetime: datetime.timedelta) -> x509.Certificate:
    """An enrolled agent's certificate: its role and identity URIs, and `agent_server_name(node)` as
    its one DNS SAN (the name a coordinator checks when it dials that node's agent)."""
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri) for uri in uris]
    return _leaf(ca_key, ca_cert, uris[0], public_key, [*names, x509.DNSName(agent_server_name(node))],
                 lifetime)


def sign_session(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                 public_key: ec.EllipticCurvePublicKey, uris: list[str],
                 lifetime: datetime.timedelta) -> x509.Certificate:
    """An enrolled session pod's certificate: its role, tenant and identity URIs, no DNS name (it
    serves nothing). Backdated by a quarter of its lifetime at most, so that renewal at two thirds
    of its validity still comes before its end for a lifetime of seconds."""
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri) for uri in uris]
    return _leaf(ca_key, ca_cert, uris[0], public_key, names, lifetime, min(BACKDATE, lifetime / 4))


def issue(directory: Path, role: Role, hosts: list[str], out: Path | None = None) -> Path:
    """Issues `<file stem>.pem/.key` signed by the CA in `directory`, written to `out` (default
    `directory`); returns the certificate path.

    `hosts` are the DNS names or IP addresses the holder serves on (server authentication); every
    certificate is also good for client authentication, since every party is a client of another.
    An agent's certificate names `agent_server_name(host)` alone, so `hosts` must be empty for one;
    no name in the agents' namespace is ever taken from `hosts` (ReservedName).
    """
    out = out or directory
    with _opened(out) as fd:
        _issue(fd, directory, role, hosts)
    return out / f"{role.file_stem}.pem"


def _issue(out: int, directory: Path, role: Role, hosts: list[str]) -> None:
    """`issue` into the directory open as `out`."""
    check_serve_on(hosts)
    if role.kind == "agent":
        if hosts:
            raise ValueError("an agent certificate names its host's agent name alone, no serve-on name")
        hosts = [agent_server_name(role.name)]
    ca_key, ca_cert = load_ca(directory)
    key = _new_key()
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role.uri())]
    if role.tenant:
        names.append(x509.UniformResourceIdentifier(role.tenant_uri()))
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = _leaf(ca_key, ca_cert, role.uri(), key.public_key(), names, LEAF_LIFETIME)
    _write_pair(out, role.file_stem, key, cert)


# Roles `certs issue` gives one at a time (etcd's own certificates come only with `certs init`).
ISSUABLE = ("agent", "coordinator", "client", "operator", "maintenance")


def issue_one(directory: Path, role: Role, serve_on: list[str], out: Path | None = None) -> Path:
    """One certificate from an existing CA, for a host or a party added after `certs init`: into
    `out` (made 0700 if missing, with a copy of ca.pem, never the CA's key), or into `directory`.
    Refuses (FileExistsError) to replace a certificate already there, and (ReservedName) a serve-on
    name in the agents' namespace. An agent's certificate names `agent_server_name(host)` alone, the
    name the coordinator checks when it dials that host's agent: `serve_on` is empty for one."""
    check_serve_on(serve_on)
    if not (directory / "ca.key").exists():
        raise FileNotFoundError(f"{directory / 'ca.key'} is missing: make the CA with `holdfast certs init "
                                f"{directory}` first")
    target = out or directory
    with _opened(target, 0o700) as fd:
        if files.exists_at(fd, f"{role.file_stem}.pem"):
            raise FileExistsError(f"{target / (role.file_stem + '.pem')} exists; remove it to issue it again")
        if out is not None and not files.exists_at(fd, "ca.pem"):
            files.write_whole(fd, "ca.pem", tls.read_file(directory / "ca.pem"), 0o644)
        _issue(fd, directory, role, serve_on)
    return target / f"{role.file_stem}.pem"


def init_local(directory: Path, agent_hosts: list[str], serve_on: list[str],
               etcd_serve_on: list[str] | None = None) -> list[Path]:
    """A CA plus one certificate per role for a local stack: what `holdfast certs init` writes.

    An agent certificate names `agent_server_name(host)` alone (no serve-on name), the name the
    coordinator checks when it dials that host's agent; a serve-on name in that namespace is refused
    (ReservedName) before anything is written. `<directory>/etcd/` is a second CA for etcd alone:
    only the coordinator holds a certificate etcd trusts, so a client or agent certificate can never
    write to etcd.
    `etcd_serve_on` (default `serve_on`) names the etcd members, e.g. a StatefulSet's pod names.
    """
    check_serve_on([*serve_on, *(etcd_serve_on or [])])
    init_ca(directory)
    init_ca(directory / ETCD_SUBDIR)
    init_agent_ca(directory)
    init_session_ca(directory)
    return ensure_issued(directory, agent_hosts, serve_on, etcd_serve_on)


def ensure_issued(directory: Path, agent_hosts: list[str], serve_on: list[str],
                  etcd_serve_on: list[str] | None = None) -> list[Path]:
    """Issues every certificate of a local stack that `directory` (a CA made here) lacks yet, an
    agent certificate an older holdfast issued again (`_current`), and the agent and session CAs an
    older directory lacks."""
    check_serve_on([*serve_on, *(etcd_serve_on or [])])
    if not (directory / f"{AGENT_CA_STEM}.key").exists():
        init_agent_ca(directory)
    if not (directory / f"{SESSION_CA_STEM}.key").exists():
        init_session_ca(directory)
    wanted = [(directory, Role("coordinator"), serve_on), (directory, Role("client"), []),
              (directory, Role("operator", "", ALL_TENANTS), []), (directory, Role("maintenance"), [])]
    wanted += [(directory, Role("agent", host), []) for host in agent_hosts]
    etcd = directory / ETCD_SUBDIR
    wanted += [(etcd, Role("etcd"), etcd_serve_on or serve_on), (etcd, Role("coordinator"), [])]
    return [issue(where, role, hosts) for where, role, hosts in wanted if not _current(where, role)]


def _current(directory: Path, role: Role) -> bool:
    """Whether `directory` holds `role`'s certificate as this version issues it. An agent's from
    before the agents' namespace names the bare host id, which no coordinator accepts now (nor may:
    other roles' certificates can carry it): re-issued, so an upgraded `up` reaches its agents."""
    path = directory / f"{role.file_stem}.pem"
    if not path.exists():
        return False
    if role.kind != "agent":
        return True
    try:
        sans = x509.load_pem_x509_certificate(tls.read_file(path)).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return sans.get_values_for_type(x509.DNSName) == [agent_server_name(role.name)]


def register(subparsers: argparse._SubParsersAction) -> None:
    certs = subparsers.add_parser("certs", help="make a local CA and a certificate per role")
    actions = certs.add_subparsers(dest="certs_command", required=True)
    init = actions.add_parser("init", help="create DIR with ca.pem, the agent and session CAs the enrollment "
                              "issuer signs with (agent-ca.pem/.key, session-ca.pem/.key), and coordinator, "
                              "client (runtime), operator, "
                              "maintenance and any --agent-host certificates")
    init.add_argument("directory", type=Path)
    init.add_argument("--add-missing", action="store_true",
                      help="DIR already has a CA: only issue the certificates it lacks (e.g. operator.pem "
                           "and maintenance.pem in a directory made by an older holdfast)")
    init.add_argument("--agent-host", action="append", default=[], metavar="HOST_ID",
                      help=f"issue an agent certificate for this host id (repeatable), naming "
                      f"HOST_ID.{AGENT_NAMESPACE} alone")
    init.add_argument("--serve-on", action="append", default=None, metavar="NAME_OR_IP",
                      help="name or address servers listen on (repeatable; default 127.0.0.1, localhost)")
    init.add_argument("--etcd-serve-on", action="append", default=None, metavar="NAME_OR_IP",
                      help="name or address of an etcd member, for etcd's own certificate (repeatable; "
                           "default: the --serve-on names)")
    init.set_defaults(handler=_init_command, parser=init)
    one = actions.add_parser(
        "issue", help="issue one certificate from the CA in DIR: a host or party added after `certs init`",
        description="Issue one certificate from the CA that `holdfast certs init DIR` made, e.g. for a "
        "node added later: holdfast certs issue DIR --role agent --host node-7 --out node-7/ "
        "(node-7/ then holds ca.pem and agent-node-7.pem/.key, never the CA's key). Exit status: "
        "0 issued, 1 the CA is missing, the certificate exists or OUTDIR is refused (another user could "
        "change it or how it is reached), 2 bad arguments.")
    one.add_argument("directory", type=Path, help="the CA directory (ca.pem, ca.key)")
    one.add_argument("--role", required=True, choices=ISSUABLE)
    one.add_argument("--host", metavar="HOST_ID", help="with --role agent: the host id it speaks for "
                     "(the node name)")
    one.add_argument("--serve-on", action="append", default=[], metavar="NAME_OR_IP",
                     help="a name or address the holder serves on (repeatable; not with --role agent, "
                     f"whose certificate names <host>.{AGENT_NAMESPACE} alone; no name under it)")
    one.add_argument("--out", type=Path, metavar="OUTDIR",
                     help="write the certificate, its key and a copy of ca.pem here (default: DIR)")
    scope = one.add_mutually_exclusive_group()
    scope.add_argument("--tenant", metavar="TENANT",
                       help="with --role client or operator: the one tenant whose sessions it acts on "
                       "(a DNS label; without it, the coordinator's default tenant; needs --out)")
    scope.add_argument("--all-tenants", action="store_true",
                       help="with --role operator: act on every tenant's sessions (needs --out)")
    one.set_defaults(handler=_issue_command, parser=one)


def _init_command(args: argparse.Namespace) -> int:
    for host in args.agent_host:  # before anything is written: no agent could present one of another id
        try:
            config.host_id(host)
        except ValueError as exc:
            args.parser.error(f"--agent-host: {exc}")
    serve_on = args.serve_on or ["127.0.0.1", "localhost"]
    try:
        if args.add_missing and (args.directory / "ca.key").exists():
            issued = ensure_issued(args.directory, args.agent_host, serve_on, args.etcd_serve_on)
        else:
            issued = init_local(args.directory, args.agent_host, serve_on, args.etcd_serve_on)
    except FileExistsError as exists:
        print(f"holdfast certs: {exists} (or pass --add-missing to issue only what it lacks)", flush=True)
        return 1
    except ReservedName as reserved:
        print(f"holdfast certs: {reserved}; nothing was written", flush=True)
        return 2
    except (files.NotPrivate, files.UntrustedLink) as refused:
        return _refused(refused)
    for path in issued:
        print(path)
    return 0


def _issue_command(args: argparse.Namespace) -> int:
    if (args.role == "agent") != bool(args.host):
        args.parser.error("--host goes with --role agent, and --role agent needs it")
    if args.role == "agent" and args.serve_on:
        args.parser.error(f"--serve-on does not go with --role agent: an agent certificate names "
                          f"<host>.{AGENT_NAMESPACE} alone, the name coordinators dial it by")
    try:
        check_serve_on(args.serve_on)
    except ReservedName as reserved:
        args.parser.error(str(reserved))
    try:
        host = config.host_id(args.host) if args.host else ""
    except ValueError as exc:
        args.parser.error(f"--host: {exc}")
    tenant = ALL_TENANTS if args.all_tenants else (args.tenant or "")
    if tenant:
        if args.role not in ("client", "operator") or (args.all_tenants and args.role != "operator"):
            args.parser.error("--tenant goes with --role client or operator, "
                              "--all-tenants with --role operator")
        if tenant != ALL_TENANTS and not TENANT.fullmatch(tenant):
            args.parser.error(f"--tenant {tenant[:80]!r}: a tenant is a DNS label ({TENANT.pattern})")
        if args.out is None:
            args.parser.error("--tenant and --all-tenants need --out: the certificate keeps its role's file "
                              "name (client.pem, operator.pem), which the CLI finds in its --tls-dir")
    try:
        path = issue_one(args.directory, Role(args.role, host, tenant), args.serve_on, args.out)
    except (FileNotFoundError, FileExistsError) as exc:
        print(f"holdfast certs: {exc}", flush=True)
        return 1
    except (files.NotPrivate, files.UntrustedLink) as refused:
        return _refused(refused)
    print(path)
    return 0


def _refused(refused: OSError) -> int:
    """Says why a directory was refused (status 1): another user could change it or how it is reached."""
    print(f"holdfast certs: {refused.filename}: {refused.strerror}; nothing was written there. Next: a "
          f"directory only uid {os.geteuid()} may change, reached through no other user's directory or "
          "link", flush=True)
    return 1
