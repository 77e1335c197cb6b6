"""A certificate's authority ends at its notAfter on a connection already open (holdfast.common.tls):
gRPC checks validity only at the handshake and keepalive holds a connection open, so a session
certificate's channel opened before expiry must not keep acting for its tenant after it. Its next
call, unary or streaming, is refused UNAUTHENTICATED saying the certificate expired, with nothing
written. Real etcd on its own CA and a real coordinator serving TLS.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from holdfast.common import certs, tls
from holdfast.common.reasons import reason_of
from holdfast.coordinator.store import etcd_credentials
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator, snapshot

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)

LIFETIME = datetime.timedelta(seconds=4)  # long enough for a handshake and a call on a loaded machine


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki")) / "ca"
    certs.init_local(base, ["node-1"], ["127.0.0.1", "localhost"])
    return base


@pytest.fixture
def coordinator(pki: Path, tls_etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(tls_etcd.url, tmp_path, prefix, args=("--tls-dir", str(pki))).start()
    try:
        yield server
    finally:
        server.stop()


def short_lived(pki: Path) -> tuple[grpc.ChannelCredentials, datetime.datetime]:
    """Credentials of a team-a runtime whose session certificate lapses after LIFETIME, and when."""
    key, ca = certs.load_ca(pki, tls.SESSION_CA_STEM)
    leaf = ec.generate_private_key(ec.SECP256R1())
    cert = certs.sign_session(key, ca, leaf.public_key(), ["holdfast://client", "holdfast-tenant://team-a"],
                              LIFETIME)
    pem = leaf.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    chain = cert.public_bytes(serialization.Encoding.PEM)
    return grpc.ssl_channel_credentials(tls.trust_bundle(pki), pem, chain), cert.not_valid_after_utc


def until_past(moment: datetime.datetime) -> None:
    """Waits for the wall-clock instant itself (what expiry is), not for a guess at a delay."""
    left = (moment - datetime.datetime.now(datetime.UTC)).total_seconds()
    time.sleep(max(0.0, left) + 1.1)  # notAfter has whole seconds; the server compares after it


def assert_expired(exc: grpc.RpcError) -> None:
    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, (exc.code(), exc.details())
    assert reason_of(exc) == "UNAUTHENTICATED"
    assert "expired" in exc.details() and "renew" in exc.details(), exc.details()


def test_an_expired_certificate_acts_on_no_call_of_a_connection_opened_before(
        pki: Path, tls_etcd: EtcdServer, coordinator: Coordinator, prefix: str) -> None:
    credentials, not_after = short_lived(pki)
    with grpc.secure_channel(coordinator.address, credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        stub.ListSessions(pb.ListSessionsRequest(), timeout=10)  # the connection is open, and admitted
        until_past(not_after)
        before = snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd"))
        with pytest.raises(grpc.RpcError) as acquire:
            stub.Acquire(pb.AcquireRequest(session_id="after-expiry", host_id="node-1",
                                           operation_id="0" * 32), timeout=10)
        assert_expired(acquire.value)
        with pytest.raises(grpc.RpcError) as listing:
            stub.ListSessions(pb.ListSessionsRequest(), timeout=10)
        assert_expired(listing.value)
        with pytest.raises(grpc.RpcError) as watch:
            next(iter(stub.WatchSessions(pb.WatchSessionsRequest(session_id="after-expiry"), timeout=10)))
        assert_expired(watch.value)
        assert snapshot(tls_etcd.url, prefix, etcd_credentials(tls_etcd.url, pki / "etcd")) == before
