"""mTLS over real gRPC on loopback: only a certificate from our CA gets through, and it names the role."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from holdfast.common import certs, tls
from holdfast.common.tls import Role


class _RoleEcho(health_pb2_grpc.HealthServicer):
    """Answers a health check with the caller's role as the service name it reports back."""

    def __init__(self) -> None:
        self.seen: list[Role | None] = []

    async def Check(self, request, context):
        self.seen.append(tls.peer_role(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def _serve(directory: Path) -> tuple[grpc.aio.Server, int, _RoleEcho]:
    server = grpc.aio.server()
    echo = _RoleEcho()
    health_pb2_grpc.add_HealthServicer_to_server(echo, server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(directory, Role("coordinator")))
    await server.start()
    return server, port, echo


async def _check(channel: grpc.aio.Channel) -> None:
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.init_local(tmp_path / "ours", ["node-a"], ["127.0.0.1"])
    certs.init_local(tmp_path / "theirs", ["node-a"], ["127.0.0.1"])
    return tmp_path


def test_each_role_arrives_as_itself(pki: Path) -> None:
    async def scenario() -> list[Role | None]:
        server, port, echo = await _serve(pki / "ours")
        try:
            for role in (Role("client"), Role("agent", "node-a")):
                creds = tls.channel_credentials(pki / "ours", role)
                async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                    await _check(channel)
        finally:
            await server.stop(None)
        return echo.seen

    assert asyncio.run(scenario()) == [Role("client"), Role("agent", "node-a")]


@pytest.mark.parametrize("how", ["plaintext", "no-client-certificate", "another-ca"])
def test_a_peer_without_our_certificate_is_refused(pki: Path, how: str) -> None:
    async def scenario() -> tuple[grpc.StatusCode, list[Role | None]]:
        server, port, echo = await _serve(pki / "ours")
        target = f"127.0.0.1:{port}"
        if how == "plaintext":
            channel = grpc.aio.insecure_channel(target)
        elif how == "no-client-certificate":
            ca = (pki / "ours" / "ca.pem").read_bytes()
            channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
        else:
            channel = grpc.aio.secure_channel(target, tls.channel_credentials(pki / "theirs", Role("client")))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _check(channel)
        finally:
            await channel.close()
            await server.stop(None)
        return refused.value.code(), echo.seen

    code, seen = asyncio.run(scenario())
    assert code == grpc.StatusCode.UNAVAILABLE
    assert seen == [], "the handler must never run for a peer the handshake refused"


def test_missing_files_name_the_command_that_makes_them(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holdfast certs init"):
        tls.server_credentials(tmp_path, Role("coordinator"))


class _Context:
    """What peer_role reads of a call: the verified certificate gRPC put in its auth context."""

    def __init__(self, pem: bytes) -> None:
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.pem]}


def test_a_certificate_past_its_not_after_has_no_role_though_its_parse_is_kept(
        pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography import x509

    pem = (pki / "ours" / "client.pem").read_bytes()
    context = _Context(pem)
    assert tls.peer_role(context) == Role("client") and not tls.peer_expired(context)  # type: ignore[arg-type]
    not_after = x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    monkeypatch.setattr(tls.time, "time", lambda: not_after)  # the instant notAfter names
    assert tls.peer_role(context) is None and tls.peer_expired(context)  # type: ignore[arg-type]
