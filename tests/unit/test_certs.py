"""Roles live in CA-signed certificates; anything ambiguous or foreign names no role."""

from __future__ import annotations

import datetime
import importlib
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from holdfast.common import certs, tls
from holdfast.common.tls import Role


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_issues_one_certificate_per_role_signed_by_the_ca(tmp_path: Path) -> None:
    issued = certs.init_local(tmp_path, ["node-a"], ["127.0.0.1"])
    roles = []
    for path in issued:
        cert = _load(path)
        cert.verify_directly_issued_by(_load(path.parent / "ca.pem"))
        roles.append((path.parent.name, tls.role_of_certificate(cert)))
        assert stat.S_IMODE(path.with_suffix(".key").stat().st_mode) == 0o600
    top = tmp_path.name
    # The local stack's own operator acts on every tenant's sessions.
    assert roles == [(top, Role("coordinator")), (top, Role("client")), (top, Role("operator", "", "*")),
                     (top, Role("maintenance")), (top, Role("agent", "node-a")),
                     ("etcd", Role("etcd")), ("etcd", Role("coordinator"))]
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    uris = {name: _load(tmp_path / f"{name}.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)
        for name in ("operator", "maintenance")}
    assert uris == {"operator": ["holdfast://operator", "holdfast-tenant://*"], "maintenance": ["holdfast://maintenance"]}


def test_an_older_directory_gets_only_what_it_lacks(tmp_path: Path) -> None:
    """`certs init --add-missing`: a CA made before the operator and maintenance roles existed
    keeps its CA and every certificate it has, and gains the new ones."""
    certs.init_local(tmp_path, ["node-a"], ["127.0.0.1"])
    for name in ("operator", "maintenance"):
        (tmp_path / f"{name}.pem").unlink()
        (tmp_path / f"{name}.key").unlink()
    kept = {p.name: p.read_bytes() for p in tmp_path.glob("*.pem")}
    cli = importlib.import_module("holdfast.cli.main")
    assert cli.main(["certs", "init", str(tmp_path)]) == 1  # refuses to overwrite a CA
    assert cli.main(["certs", "init", str(tmp_path), "--add-missing", "--agent-host", "node-a",
                     "--serve-on", "127.0.0.1"]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.pem") if p.name in kept} == kept
    assert (tmp_path / "operator.pem").exists() and (tmp_path / "maintenance.key").exists()


def test_etcd_trusts_a_ca_of_its_own(tmp_path: Path) -> None:
    # A client or agent certificate must not verify against etcd's CA, or it could write around fences.
    certs.init_local(tmp_path, ["node-a"], ["127.0.0.1"])
    etcd_ca = _load(tmp_path / "etcd" / "ca.pem")
    for name in ("client.pem", "agent-node-a.pem", "coordinator.pem"):
        with pytest.raises(InvalidSignature):
            _load(tmp_path / name).verify_directly_issued_by(etcd_ca)


def test_an_agent_certificate_names_its_hosts_agent_name_alone(tmp_path: Path) -> None:
    # No serve-on name and no bare host id: another role's certificate may carry those.
    certs.init_local(tmp_path, ["node-a"], ["127.0.0.1", "node-a"])
    sans = _load(tmp_path / "agent-node-a.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["node-a.agent.holdfast.invalid"]
    assert sans.get_values_for_type(x509.IPAddress) == []


def test_add_missing_issues_again_an_agent_certificate_without_its_agent_name(tmp_path: Path) -> None:
    # What an older holdfast issued: the bare host id, which a coordinator no longer accepts.
    certs.init_local(tmp_path, [], ["127.0.0.1"])
    ca_key, ca_cert = certs.load_ca(tmp_path)
    key = ec.generate_private_key(ec.SECP256R1())
    old = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "holdfast://agent/node-a")]))
           .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(1)
           .not_valid_before(datetime.datetime(2020, 1, 1)).not_valid_after(datetime.datetime(2040, 1, 1))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier("holdfast://agent/node-a"),
                                                       x509.DNSName("node-a")]), critical=False)
           .sign(ca_key, hashes.SHA256()))
    (tmp_path / "agent-node-a.pem").write_bytes(old.public_bytes(serialization.Encoding.PEM))
    coordinator = (tmp_path / "coordinator.pem").read_bytes()
    assert certs.ensure_issued(tmp_path, ["node-a"], ["127.0.0.1"]) == [tmp_path / "agent-node-a.pem"]
    sans = _load(tmp_path / "agent-node-a.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["node-a.agent.holdfast.invalid"]
    assert (tmp_path / "coordinator.pem").read_bytes() == coordinator  # the rest is kept
    assert certs.ensure_issued(tmp_path, ["node-a"], ["127.0.0.1"]) == []  # and now current


@pytest.mark.parametrize("name", ["node-a.agent.holdfast.invalid", "*.AGENT.holdfast.invalid",
                                  "agent.holdfast.invalid.", "x.node-a.Agent.Holdfast.Invalid"])
def test_no_certificate_is_issued_with_a_name_in_the_agents_namespace(tmp_path: Path, name: str) -> None:
    with pytest.raises(certs.ReservedName):
        certs.init_local(tmp_path / "init", [], ["127.0.0.1", name])
    with pytest.raises(certs.ReservedName):
        certs.init_local(tmp_path / "etcd", [], ["127.0.0.1"], [name])
    assert not (tmp_path / "init").exists() and not (tmp_path / "etcd").exists()  # nothing written
    certs.init_local(tmp_path / "ca", [], ["127.0.0.1"])
    for role in (Role("coordinator"), Role("client"), Role("operator"), Role("maintenance")):
        with pytest.raises(certs.ReservedName):
            certs.issue_one(tmp_path / "ca", role, [name], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_etcd_member_names_go_on_the_etcd_certificate_only(tmp_path: Path) -> None:
    members = ["holdfast-etcd-0.holdfast-etcd", "holdfast-etcd-1.holdfast-etcd"]
    certs.init_local(tmp_path, [], ["holdfast-coordinator"], members)

    def dns(path: Path) -> list[str]:
        return _load(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.DNSName)

    assert dns(tmp_path / "etcd" / "etcd.pem") == members
    assert dns(tmp_path / "coordinator.pem") == ["holdfast-coordinator"]


def test_ensure_issued_adds_only_what_is_missing(tmp_path: Path) -> None:
    certs.init_local(tmp_path, ["node-a"], ["127.0.0.1"])
    before = (tmp_path / "client.pem").read_bytes()
    added = certs.ensure_issued(tmp_path, ["node-a", "node-b"], ["127.0.0.1"])
    assert added == [tmp_path / "agent-node-b.pem"]
    assert (tmp_path / "client.pem").read_bytes() == before


def test_a_certificate_from_another_ca_does_not_verify(tmp_path: Path) -> None:
    certs.init_local(tmp_path / "one", [], ["127.0.0.1"])
    certs.init_local(tmp_path / "two", [], ["127.0.0.1"])
    foreign = _load(tmp_path / "two" / "client.pem")
    # Both CAs carry the same subject name, so only the signature tells them apart.
    with pytest.raises(InvalidSignature):
        foreign.verify_directly_issued_by(_load(tmp_path / "one" / "ca.pem"))


def test_init_refuses_to_overwrite_a_ca(tmp_path: Path) -> None:
    certs.init_ca(tmp_path)
    before = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(FileExistsError):
        certs.init_ca(tmp_path)
    assert (tmp_path / "ca.pem").read_bytes() == before


@pytest.mark.parametrize(("uri", "role"), [
    ("holdfast://coordinator", Role("coordinator")),
    ("holdfast://client", Role("client")),
    ("holdfast://agent/node-a", Role("agent", "node-a")),
    ("holdfast://agent", None),               # an agent certificate must name its host
    ("holdfast://agent/a/b", None),
    ("holdfast://client/x", None),
    ("holdfast://root", None),
    ("spiffe://coordinator", None),
    ("", None),
])
def test_role_from_uri(uri: str, role: Role | None) -> None:
    assert tls.role_from_uri(uri) == role


def test_a_certificate_claiming_two_roles_has_none(tmp_path: Path) -> None:
    certs.init_ca(tmp_path)
    path = certs.issue(tmp_path, Role("client"), [])
    cert = _load(path)
    assert tls.role_of_certificate(cert) == Role("client")
    # Re-sign the same key with a second role URI beside the first.
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.datetime.now(datetime.UTC)
    both = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
            .public_key(cert.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.UniformResourceIdentifier("holdfast://client"),
                x509.UniformResourceIdentifier("holdfast://coordinator")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    assert tls.role_of_certificate(both) is None


def test_issue_adds_one_agent_for_a_later_host_with_only_what_the_node_needs(tmp_path: Path) -> None:
    ca, node = tmp_path / "ca", tmp_path / "node-7"
    certs.init_local(ca, [], ["127.0.0.1"])  # no host named up front
    path = certs.issue_one(ca, Role("agent", "node-7"), [], node)
    cert = _load(path)
    cert.verify_directly_issued_by(_load(ca / "ca.pem"))
    assert tls.role_of_certificate(cert) == Role("agent", "node-7")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # What a coordinator dialling it checks:
    assert sans.get_values_for_type(x509.DNSName) == ["node-7.agent.holdfast.invalid"]
    assert sorted(p.name for p in node.iterdir()) == ["agent-node-7.key", "agent-node-7.pem", "ca.pem"]
    assert stat.S_IMODE(node.stat().st_mode) == 0o700
    assert stat.S_IMODE((node / "agent-node-7.key").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        certs.issue_one(ca, Role("agent", "node-7"), [], node)  # never replaced silently
    with pytest.raises(FileNotFoundError, match="certs init"):
        certs.issue_one(tmp_path / "no-ca", Role("client"), [])


@pytest.mark.parametrize("argv,code,says", [
    (["--role", "agent"], 2, "--role agent needs it"),
    (["--role", "client", "--host", "node-1"], 2, "--host goes with --role agent"),
    (["--role", "agent", "--host", "bad host"], 2, "must match"),
    (["--role", "agent", "--host", "node-1", "--serve-on", "127.0.0.7"], 2, "does not go with --role agent"),
    (["--role", "coordinator", "--serve-on", "m2.agent.holdfast.invalid"], 2, "are agents' own"),
    (["--role", "etcd"], 2, "invalid choice"),
    (["--role", "operator"], 0, "operator.pem"),
])
def test_certs_issue_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
                             says: str) -> None:
    from holdfast.cli.main import main

    certs.init_ca(tmp_path)
    if code == 2:
        with pytest.raises(SystemExit) as exited:
            main(["certs", "issue", str(tmp_path), "--out", str(tmp_path / "out"), *argv])
        assert exited.value.code == 2
    else:
        assert main(["certs", "issue", str(tmp_path), "--out", str(tmp_path / "out"), *argv]) == 0
    out = capsys.readouterr()
    assert says in out.out + out.err


def test_certs_init_refuses_an_agent_host_id_no_agent_can_have_before_writing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`certs init --agent-host 'bad host'` wrote the CAs and a certificate no agent could present
    (`certs issue --host` refused it); now it is refused (2) with nothing written."""
    from holdfast.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["certs", "init", str(tmp_path / "pki"), "--agent-host", "node-1", "--agent-host", "bad host"])
    assert exited.value.code == 2 and "--agent-host: 'bad host' must match" in capsys.readouterr().err
    assert not (tmp_path / "pki").exists()
