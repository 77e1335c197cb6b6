"""Certificates change under running servers, and no call fails.

An enrolled agent renews (a fresh token, a new key, the issuer's new certificate) while a coordinator
certificate makes 1,000 ProbeOwners calls through the agent's role gate, opening a new connection
every 100 calls so handshakes happen on both sides of the swap: 0 failures, and the new certificate
is the one served afterwards. A coordinator's certificate replaced on disk is served from the next
handshake without a restart: a client that accepts only the new certificate's name is refused
before and served after. The renewal loop renews by itself once due and, refused (the pod gone),
keeps serving its current certificate and counts the failure.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from holdfast.agent import enroll, hostinfo, rotation
from holdfast.agent.authorization import agent_rule
from holdfast.agent.service import HostAgentService
from holdfast.common import certs, reloading, tls
from holdfast.common import serving as serving_
from holdfast.common.authorization import RoleGate
from holdfast.common.identifiers import agent_server_name
from holdfast.common.tls import Role
from holdfast.coordinator.routing import Router
from holdfast.enrollment import issuer as enrollment
from holdfast.v1 import agent_pb2, agent_pb2_grpc, coordinator_pb2
from tests.integration.coordinator_fixtures import run_async
from tests.integration.k8s_standin import KubeStandIn

pytest_plugins = ["tests.integration.k8s_standin"]

pytestmark = pytest.mark.timeout(120)
AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["HostAgent"].full_name
PROBES = 1000
PER_CONNECTION = 100


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    base = tmp_path / "ca"
    certs.init_local(base, [], ["127.0.0.1", "localhost"])
    return base


def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def node_1_agent(kube: KubeStandIn, tmp_path: Path) -> tuple[dict[str, Any], Path, enrollment.KubeApi]:
    """node-1 with its agent pod: the pod, its projected token in a file, and the issuer's API client."""
    kube.add_node("node-1")
    pod = kube.add_pod("holdfast", "holdfast-agent-node-1", "node-1")
    token_file = tmp_path / "token"
    token_file.write_text(kube.token(pod))
    return pod, token_file, enrollment.KubeApi(kube.url, str(kube.ca_file), str(kube.issuer_token_file))


async def node_1_agent_server(
        agent_dir: Path) -> tuple[reloading.ReloadingCredentials, HostAgentService, serving_.Serving]:
    """node-1's agent serving mTLS from agent_dir's files, as they change."""
    credentials = reloading.ReloadingCredentials(agent_dir, Role("agent", "node-1"))
    service = HostAgentService("node-1", hostinfo.gather(), "HOLDFAST_SPAWN_TOKEN")
    agent = await serving_.start("127.0.0.1:0", AGENT_SERVICE,
                                 functools.partial(agent_pb2_grpc.add_HostAgentServicer_to_server, service),
                                 credentials.server_credentials(),
                                 [RoleGate(AGENT_SERVICE, agent_rule)])
    return credentials, service, agent


@run_async
async def test_renewal_swaps_the_agents_certificate_while_1000_probes_run(pki: Path, kube: KubeStandIn,
                                                                         tmp_path: Path) -> None:
    pod, token_file, api = node_1_agent(kube, tmp_path)
    issuing = await enrollment.start("127.0.0.1:0", pki, enrollment.Issuer.from_dir(pki, api, "holdfast"))
    agent_dir = tmp_path / "agent-tls"
    enroller = rotation.Enroller(issuing.address, pki / "ca.pem", "node-1", token_file, agent_dir)
    await rotation.ensure(enroller)
    first = serial(enroller.cert_path)
    credentials, service, agent = await node_1_agent_server(agent_dir)
    # This test process itself, as an owner the agent judges: a real probe each call.
    owner = agent_pb2.ProcessIdentity(host_id="node-1", incarnation=service.facts.incarnation,
                                      pid=os.getpid(), start_ticks=1, spawn_token="0" * 32)
    probe = agent_pb2.ProbeOwnersRequest(owners=[owner])
    failures: list[str] = []
    try:
        for batch in range(PROBES // PER_CONNECTION):
            if batch == PROBES // PER_CONNECTION // 2:
                token_file.write_text(kube.token(pod))  # kubelet's refreshed projected token
                await enroller.enroll_once()
                assert credentials.reload()
            # The coordinator dials an agent accepting only a certificate naming that host's agent.
            channel = tls.open_channel(agent.address, pki, Role("coordinator"),
                                       server_name=agent_server_name("node-1"))
            async with channel:
                stub = agent_pb2_grpc.HostAgentStub(channel)
                for _ in range(PER_CONNECTION):
                    try:
                        await stub.ProbeOwners(probe, timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        failures.append(f"{exc.code().name}: {exc.details()}")
    finally:
        await agent.server.stop(0)
        await issuing.server.stop(0)
        api.close()
    assert failures == []
    assert serial(enroller.cert_path) != first
    assert credentials.version == 2 and credentials.served == 2  # the renewed pair was handed to gRPC


def test_renewal_is_due_at_two_thirds_of_the_lifetime(pki: Path, tmp_path: Path) -> None:
    key, ca = certs.load_ca(pki, tls.AGENT_CA_STEM)
    cert = certs.sign_agent(key, ca, ec.generate_private_key(ec.SECP256R1()).public_key(), "n",
                            ["holdfast://agent/n"], datetime.timedelta(hours=24))
    start = cert.not_valid_before_utc
    total = cert.not_valid_after_utc - start
    pem = cert.public_bytes(serialization.Encoding.PEM)
    assert enroll.renew_after(pem, start) == pytest.approx(total.total_seconds() * 2 / 3)
    path = tmp_path / "agent-n.pem"
    path.write_bytes(pem)
    assert rotation.due_in(path) is not None
    assert rotation.due_in(tmp_path / "missing.pem") is None


@run_async
async def test_a_coordinator_serves_its_replaced_certificate_without_a_restart(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every handshake looks at the files (the default looks every few seconds; a test does not wait).
    monkeypatch.setattr(reloading, "POLL_SECONDS", 0.0)
    credentials = reloading.ReloadingCredentials(pki, Role("coordinator"))
    server = await serving_.start("127.0.0.1:0", "holdfast.v1.Coordinator", lambda _server: None,
                                  credentials.server_credentials())

    async def health(name: str) -> str:
        async with tls.open_channel(server.address, pki, Role("client"), server_name=name) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                        timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    try:
        assert await health("localhost") == "SERVING"
        assert await health("coordinator-2.test") == "UNAVAILABLE"  # not a name the old one carries
        staged = tmp_path / "staged"
        staged.mkdir()
        certs.issue(pki, Role("coordinator"), ["coordinator-2.test"], out=staged)
        # As a secret volume or cert-manager replaces them: each file whole, by rename.
        for suffix in ("key", "pem"):
            (staged / f"coordinator.{suffix}").rename(pki / f"coordinator.{suffix}")
        assert await health("coordinator-2.test") == "SERVING"
        assert credentials.version == 2
    finally:
        await server.server.stop(0)


@run_async
async def test_the_agent_renews_by_itself_when_due_and_keeps_its_certificate_when_refused(
        pki: Path, kube: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, token_file, api = node_1_agent(kube, tmp_path)
    # A minute's lifetime starting five minutes back: every certificate is past two thirds at once.
    issuer = enrollment.Issuer.from_dir(pki, api, "holdfast", datetime.timedelta(minutes=1))
    issuing = await enrollment.start("127.0.0.1:0", pki, issuer)
    agent_dir = tmp_path / "agent-tls"
    enroller = rotation.Enroller(issuing.address, pki / "ca.pem", "node-1", token_file, agent_dir)
    await rotation.ensure(enroller)
    credentials = reloading.ReloadingCredentials(agent_dir, Role("agent", "node-1"))
    renewed, failed = asyncio.Event(), asyncio.Event()
    took = credentials.reload

    def reload() -> bool:
        renewed.set()
        return took()

    monkeypatch.setattr(credentials, "reload", reload)
    monkeypatch.setattr(rotation.log, "error", lambda *args, **kwargs: failed.set())
    monkeypatch.setattr(rotation, "MIN_RETRY_SECONDS", 0.01)
    first = serial(enroller.cert_path)
    renewer = asyncio.create_task(rotation.renew_forever(enroller, credentials))
    try:
        await asyncio.wait_for(renewed.wait(), 30)
        assert serial(enroller.cert_path) != first and credentials.version >= 2
        del kube.state.pods[("holdfast", "holdfast-agent-node-1")]
        await asyncio.wait_for(failed.wait(), 30)
        kept, failures = serial(enroller.cert_path), _renewals("failed")
        failed.clear()
        await asyncio.wait_for(failed.wait(), 30)  # refused again: still the same certificate
        assert serial(enroller.cert_path) == kept and _renewals("failed") > failures
    finally:
        renewer.cancel()
        await issuing.server.stop(0)
        api.close()


def _renewals(outcome: str) -> float:
    return REGISTRY.get_sample_value("holdfast_certificate_renewals_total", {"outcome": outcome}) or 0.0


@run_async
async def test_the_coordinator_dials_agents_with_its_renewed_certificate(pki: Path, tmp_path: Path) -> None:
    """The router's cached channel would keep presenting the certificate it was opened with; once the
    coordinator's files change, the next call goes out on a channel with the new one."""
    agent_dir = tmp_path / "agent"
    certs.issue_one(pki, Role("agent", "node-1"), [], agent_dir)
    _, _, agent = await node_1_agent_server(agent_dir)
    coordinator_dir = tmp_path / "coordinator"
    coordinator_dir.mkdir()
    (coordinator_dir / "ca.pem").write_bytes((pki / "ca.pem").read_bytes())
    # First a certificate the agent refuses (a client's), installed under the coordinator's names.
    certs.issue(pki, Role("client"), [], out=tmp_path)
    for suffix in ("key", "pem"):
        (tmp_path / f"client.{suffix}").rename(coordinator_dir / f"coordinator.{suffix}")
    router = Router(coordinator_dir)
    registration = coordinator_pb2.HostRegistration(host_id="node-1", address=agent.address)
    info = agent_pb2.GetHostInfoRequest()
    try:
        stub = router.agent(registration)
        assert stub is not None
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetHostInfo(info, timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        certs.issue(pki, Role("coordinator"), [], out=tmp_path)
        for suffix in ("key", "pem"):
            (tmp_path / f"coordinator.{suffix}").rename(coordinator_dir / f"coordinator.{suffix}")
        stub = router.agent(registration)
        assert stub is not None
        assert (await stub.GetHostInfo(info, timeout=10)).host_id == "node-1"
    finally:
        await router.close()
        await agent.server.stop(0)


@run_async
async def test_an_agent_waits_for_an_issuer_not_up_yet_but_not_for_a_refusal(
        pki: Path, kube: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, token_file, api = node_1_agent(kube, tmp_path)
    issuer = enrollment.Issuer.from_dir(pki, api, "holdfast")
    # A port that was just free: nothing answers there until the issuer starts on it below.
    probe = await enrollment.start("127.0.0.1:0", pki, issuer)
    address = probe.address
    await probe.server.stop(0)
    unanswered = asyncio.Event()
    monkeypatch.setattr(rotation.log, "warning", lambda *args, **kwargs: unanswered.set())
    monkeypatch.setattr(rotation, "START_RETRY_FIRST_SECONDS", 0.05)
    enroller = rotation.Enroller(address, pki / "ca.pem", "node-1", token_file, tmp_path / "agent-tls")
    waiting = asyncio.create_task(rotation.ensure_waiting(enroller, wait_seconds=60))
    issuing = None
    try:
        await asyncio.wait_for(unanswered.wait(), 30)
        assert not waiting.done()
        issuing = await enrollment.start(address, pki, issuer)
        await asyncio.wait_for(waiting, 30)
        assert enroller.cert_path.exists()
        # A refusal is not waited out: the pod is gone, so the verdict stands.
        enroller.cert_path.unlink()
        del kube.state.pods[("holdfast", "holdfast-agent-node-1")]
        with pytest.raises(enroll.EnrollmentFailed) as refused:
            await rotation.ensure_waiting(enroller, wait_seconds=60)
        assert refused.value.reason == "TOKEN_REJECTED"
    finally:
        waiting.cancel()
        if issuing is not None:
            await issuing.server.stop(0)
        api.close()
