"""mTLS and roles over the wire, with a real etcd on its own CA, a real coordinator and a real agent.

Refused: plaintext, no certificate, another CA's certificate, a certificate without a role, the wrong
role (a client or an agent calling an agent; a client, a coordinator or host G's agent registering
host H; an agent changing a session). A refusal writes nothing (etcd compared before and after) and
its message carries no secret. A valid client certificate still needs the grant secret for every
owner write, and a registration cannot point the coordinator at another host's agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from holdfast.common import certs, tls
from holdfast.common.identifiers import agent_server_name
from holdfast.common.reasons import reason_of
from holdfast.common.tls import Role
from holdfast.coordinator.routing import Router
from holdfast.coordinator.store import Store, StoreUnavailable, etcd_credentials
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator, etcd_server, run_async, snapshot

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki"))
    certs.init_local(base / "ours", ["host-a", "host-b"], ["127.0.0.1", "localhost"])
    certs.issue(base / "ours", Role("root"), [])  # CA-signed, but names no holdfast role
    certs.init_local(base / "theirs", ["host-a"], ["127.0.0.1", "localhost"])
    return base


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[EtcdServer]:
    yield from etcd_server(tmp_path_factory, pki / "ours" / "etcd")


@pytest.fixture
def coordinator_tls(tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path) -> Iterator[Coordinator]:
    server = Coordinator(tls_etcd.url, tmp_path, prefix, args=("--tls-dir", str(pki / "ours"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_tls(tmp_path: Path, pki: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path, "host-a", args=["--tls-dir", str(pki / "ours")])
    try:
        yield agent
    finally:
        agent.stop()


def etcd_state(etcd: EtcdServer, prefix: str, pki: Path) -> list[tuple[str, bytes]]:
    return snapshot(etcd.url, prefix, etcd_credentials(etcd.url, pki / "ours" / "etcd"))


def coordinator_as(coordinator: Coordinator, pki: Path, role: Role) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(
        tls.open_channel(coordinator.address, pki / "ours", role, sync=True))


def agent_as(agent: AgentProcess, pki: Path, role: Role) -> agent_pb2_grpc.HostAgentStub:
    # The agent's certificate names its host's agent name, not the loopback address it listens on.
    return agent_pb2_grpc.HostAgentStub(
        tls.open_channel(agent.address, pki / "ours", role, server_name=agent_server_name("host-a"),
                         sync=True))


def refused(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        result = call(request, timeout=10)
        if not hasattr(result, "SerializeToString"):  # a server stream: the refusal comes on reading
            list(result)
    return err.value


def handshake_failures(address: str, pki: Path, server_name: str) -> list[grpc.StatusCode]:
    """Plaintext, a TLS client with no certificate, and a certificate of another CA."""
    ca = (pki / "ours" / "ca.pem").read_bytes()
    theirs = pki / "theirs"
    opts = [("grpc.ssl_target_name_override", server_name)]
    channels = [
        grpc.insecure_channel(address),
        grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca), opts),
        grpc.secure_channel(address, grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=(theirs / "coordinator.key").read_bytes(),
            certificate_chain=(theirs / "coordinator.pem").read_bytes()), opts),
    ]
    codes = []
    for channel in channels:
        with channel:
            err = refused(health_pb2_grpc.HealthStub(channel).Check, health_pb2.HealthCheckRequest())
            codes.append(err.code())  # type: ignore[attr-defined]
    return codes


def registration(host_id: str, address: str = "127.0.0.250:1") -> pb.RegisterHostRequest:
    return pb.RegisterHostRequest(registration=pb.HostRegistration(
        host_id=host_id, address=address, spawn_token_env="HOLDFAST_SPAWN_TOKEN"), ttl_seconds=30)


def test_plaintext_no_certificate_and_another_ca_are_refused_at_the_handshake(
        coordinator_tls: Coordinator, agent_tls: AgentProcess, tls_etcd: EtcdServer, prefix: str,
        pki: Path) -> None:
    before = etcd_state(tls_etcd, prefix, pki)
    unavailable = [grpc.StatusCode.UNAVAILABLE] * 3
    assert handshake_failures(coordinator_tls.address, pki, "127.0.0.1") == unavailable
    assert handshake_failures(agent_tls.address, pki, "host-a") == unavailable
    # The same link with our CA's certificate works, so the refusals above are the certificates'.
    health = health_pb2_grpc.HealthStub(tls.open_channel(coordinator_tls.address, pki / "ours",
                                                         Role("client"), sync=True))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert etcd_state(tls_etcd, prefix, pki) == before


def test_an_agent_answers_only_coordinator_certificates(agent_tls: AgentProcess, pki: Path) -> None:
    token = secrets.token_hex(16)
    owner = apb.ProcessIdentity(host_id="host-a", incarnation=apb.HostIncarnation(boot_id="b"), pid=1,
                                start_ticks=1, spawn_token=token)
    calls = {
        "GetHostInfo": apb.GetHostInfoRequest(),
        "AttestSpawn": apb.AttestSpawnRequest(spawn_token=token),
        "ProbeOwners": apb.ProbeOwnersRequest(owners=[owner]),
        "ScanSpawnToken": apb.ScanSpawnTokenRequest(spawn_token=token),
        "ListTokenRoots": apb.ListTokenRootsRequest(),
        "WatchExits": apb.WatchExitsRequest(owners=[owner]),
        "KillOwner": apb.KillOwnerRequest(owner=owner),
    }
    assert set(calls) == set(apb.DESCRIPTOR.services_by_name["HostAgent"].methods_by_name)
    for role in (Role("client"), Role("agent", "host-a"), Role("root")):
        stub = agent_as(agent_tls, pki, role)
        wanted = grpc.StatusCode.UNAUTHENTICATED if role.kind == "root" else grpc.StatusCode.PERMISSION_DENIED
        for method, request in calls.items():
            err = refused(getattr(stub, method), request)
            assert err.code() == wanted, (role, method, err)  # type: ignore[attr-defined]
            assert reason_of(err) in ("WRONG_ROLE", "UNAUTHENTICATED")  # type: ignore[arg-type]
            assert token not in err.details() and "BEGIN" not in err.details()  # type: ignore[attr-defined]
    coordinator = agent_as(agent_tls, pki, Role("coordinator"))
    assert coordinator.GetHostInfo(apb.GetHostInfoRequest(), timeout=10).host_id == "host-a"
    # Health is open to any certificate of the CA: it says nothing about processes.
    health = health_pb2_grpc.HealthStub(tls.open_channel(agent_tls.address, pki / "ours", Role("client"),
                                                         server_name=agent_server_name("host-a"), sync=True))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING


def test_the_plaintext_health_port_answers_health_and_nothing_else(
        tls_etcd: EtcdServer, tmp_path: Path, prefix: str, pki: Path) -> None:
    """Kubelet gRPC probes cannot present a certificate (deploy/ points them at --health-listen)."""
    args = ("--tls-dir", str(pki / "ours"), "--health-listen", "127.0.0.1:0")
    coordinator = Coordinator(tls_etcd.url, tmp_path, prefix, args=args).start()
    agent = AgentProcess(tmp_path, "host-a", args=list(args))
    try:
        before = etcd_state(tls_etcd, prefix, pki)
        for server, main in ((coordinator.health, coordinator.address), (agent.health, agent.address)):
            assert server and server != main
            with grpc.insecure_channel(server) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert check.status == health_pb2.HealthCheckResponse.SERVING
                hosts = coordinator_pb2_grpc.CoordinatorStub(channel).ListHosts
                listed = refused(hosts, pb.ListHostsRequest())
                assert listed.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
                info = refused(agent_pb2_grpc.HostAgentStub(channel).GetHostInfo, apb.GetHostInfoRequest())
                assert info.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        assert etcd_state(tls_etcd, prefix, pki) == before
    finally:
        agent.stop()
        coordinator.stop()


def test_only_the_agent_certificate_of_host_h_registers_h(
        coordinator_tls: Coordinator, tls_etcd: EtcdServer, prefix: str, pki: Path) -> None:
    before = etcd_state(tls_etcd, prefix, pki)
    for role in (Role("client"), Role("coordinator"), Role("agent", "host-b")):
        err = refused(coordinator_as(coordinator_tls, pki, role).RegisterHost, registration("host-a"))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, role  # type: ignore[attr-defined]
        assert reason_of(err) == "WRONG_ROLE"  # type: ignore[arg-type]
    err = refused(coordinator_as(coordinator_tls, pki, Role("root")).RegisterHost, registration("host-a"))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert etcd_state(tls_etcd, prefix, pki) == before

    host_a = coordinator_as(coordinator_tls, pki, Role("agent", "host-a"))
    lease = host_a.RegisterHost(registration("host-a"), timeout=10).lease_id
    err = refused(coordinator_as(coordinator_tls, pki, Role("agent", "host-b")).Heartbeat,
                  pb.HeartbeatRequest(host_id="host-a", lease_id=lease))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert host_a.Heartbeat(pb.HeartbeatRequest(host_id="host-a", lease_id=lease), timeout=10).ttl_seconds > 0
    # An agent may read but never change a session.
    assert [h.host_id for h in host_a.ListHosts(pb.ListHostsRequest(), timeout=10).hosts] == ["host-a"]
    after_registration = etcd_state(tls_etcd, prefix, pki)
    err = refused(host_a.Acquire, pb.AcquireRequest(session_id="session-tls-01", host_id="host-a",
                                                    operation_id=secrets.token_hex(16)))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert etcd_state(tls_etcd, prefix, pki) == after_registration


def test_a_client_certificate_still_needs_the_grant_secret_for_every_owner_write(
        coordinator_tls: Coordinator, tls_etcd: EtcdServer, prefix: str, pki: Path) -> None:
    coordinator_as(coordinator_tls, pki, Role("agent", "host-a")).RegisterHost(registration("host-a"),
                                                                               timeout=10)
    client = coordinator_as(coordinator_tls, pki, Role("client"))
    sid = "session-secret-01"
    grant = client.Acquire(pb.AcquireRequest(session_id=sid, host_id="host-a",
                                             operation_id=secrets.token_hex(16)), timeout=10).grant
    before = etcd_state(tls_etcd, prefix, pki)
    wrong = secrets.token_hex(16)
    writes = [
        (client.CommitOwner, pb.CommitOwnerRequest(session_id=sid, fence=grant.fence, secret=wrong)),
        (client.RecordProviderHandle, pb.RecordProviderHandleRequest(session_id=sid, fence=grant.fence,
                                                                     secret=wrong, handle="thread-1")),
        (client.FencedPut, pb.FencedPutRequest(session_id=sid, fence=grant.fence, secret=wrong, key="k",
                                               value=b"v")),
        (client.Release, pb.ReleaseRequest(session_id=sid, fence=grant.fence, secret=wrong)),
    ]
    for call, request in writes:
        err = refused(call, request)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, request  # type: ignore[attr-defined]
        assert reason_of(err) == "PERMISSION_DENIED"  # type: ignore[arg-type]
        details = err.details()  # type: ignore[attr-defined]
        assert grant.secret not in details and wrong not in details and grant.spawn_token not in details
    assert etcd_state(tls_etcd, prefix, pki) == before
    # The right secret is accepted: the refusals above were the secret's, not the certificate's.
    client.Release(pb.ReleaseRequest(session_id=sid, fence=grant.fence, secret=grant.secret), timeout=10)


def test_a_registration_cannot_point_the_coordinator_at_another_hosts_agent(
        coordinator_tls: Coordinator, agent_tls: AgentProcess, pki: Path) -> None:
    client = coordinator_as(coordinator_tls, pki, Role("client"))
    # host-b's registration names host-a's agent: its certificate is host-a's, so no answer counts.
    coordinator_as(coordinator_tls, pki, Role("agent", "host-b")).RegisterHost(
        registration("host-b", agent_tls.address), timeout=10)
    coordinator_as(coordinator_tls, pki, Role("agent", "host-a")).RegisterHost(
        registration("host-a", agent_tls.address), timeout=10)
    reasons = {}
    for host in ("host-a", "host-b"):
        sid = f"session-route-{host}"
        grant = client.Acquire(pb.AcquireRequest(session_id=sid, host_id=host,
                                                 operation_id=secrets.token_hex(16)), timeout=10).grant
        err = refused(client.CommitOwner, pb.CommitOwnerRequest(session_id=sid, fence=grant.fence,
                                                                secret=grant.secret))
        assert reason_of(err) == "ATTESTATION_FAILED"  # type: ignore[arg-type]
        reasons[host] = err.details()  # type: ignore[attr-defined]
    assert "tree roots carry the token" in reasons["host-a"]  # the agent answered, over mTLS
    assert "UNAVAILABLE" in reasons["host-b"]  # the certificate did not name host-b: no answer


async def answers_as_agent(pki: Path, holder: Role, host: str, held_in: Path | None = None) -> bool:
    """Whether a server holding `holder`'s certificate (in `held_in`, default `pki`) gets past the
    handshake of the coordinator of `pki` dialling host `host`'s agent at its address (Router.agent)."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(held_in or pki, holder))
    server.start()
    router = Router(pki)
    try:
        stub = router.agent(pb.HostRegistration(host_id=host, address=f"127.0.0.1:{port}"))
        assert stub is not None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetHostInfo(apb.GetHostInfoRequest(), timeout=10)
        # Past the handshake, a server that is no agent answers UNIMPLEMENTED; a refused handshake
        # is UNAVAILABLE.
        assert err.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE), err.value
        return err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await router.close()
        server.stop(0)


@run_async
async def test_no_certificate_but_host_hs_own_agent_passes_for_hs_agent(tmp_path: Path) -> None:
    # Coordinators on the agents' machines: every host id is also a serve-on name. Were a host id the
    # name the coordinator dials an agent by, agent m1's key or the coordinator's certificate (or any
    # issued with --serve-on m2) would answer probes for m2's owners, and a "dead" would grant them.
    certs.init_local(tmp_path, ["m1", "m2"], ["m1", "m2", "127.0.0.1"])
    certs.issue_one(tmp_path, Role("client"), ["m2"], tmp_path / "client-m2")
    assert await answers_as_agent(tmp_path, Role("agent", "m2"), "m2")  # the check passes the right one
    assert not await answers_as_agent(tmp_path, Role("agent", "m1"), "m2")
    assert not await answers_as_agent(tmp_path, Role("coordinator"), "m2")
    assert not await answers_as_agent(tmp_path, Role("client"), "m2", tmp_path / "client-m2")
    with pytest.raises(certs.ReservedName):  # nor may any certificate be issued with m2's agent name
        certs.issue_one(tmp_path, Role("operator"), [agent_server_name("m2").upper()], tmp_path / "op")
    assert not (tmp_path / "op").exists()


@run_async
async def test_etcd_takes_only_the_coordinators_certificate(tls_etcd: EtcdServer, pki: Path) -> None:
    async def refused(credentials: grpc.ChannelCredentials) -> None:
        store = Store.connect(tls_etcd.url, credentials)
        try:
            with pytest.raises(StoreUnavailable):
                await store.get("/holdfast/v1/sessions/x")
        finally:
            await store.close()

    # Together: each waits out the store's call timeout for a handshake etcd keeps refusing.
    await asyncio.gather(refused(tls.channel_credentials(pki / "ours", Role("client"))),
                         refused(tls.channel_credentials(pki / "ours", Role("agent", "host-a"))))
    with pytest.raises(ValueError, match="https"):
        etcd_credentials(tls_etcd.url.replace("https", "http"), pki / "ours" / "etcd")
    store = Store.connect(tls_etcd.url, etcd_credentials(tls_etcd.url, pki / "ours" / "etcd"))
    try:
        assert await store.get("/holdfast/v1/sessions/x") is None
    finally:
        await store.close()


def test_a_coordinator_with_tls_refuses_a_plaintext_etcd(tls_etcd: EtcdServer, pki: Path) -> None:
    plain = tls_etcd.url.replace("https", "http")
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", "coordinator", "serve",
                           "--etcd", plain, "--listen", "127.0.0.1:0", "--tls-dir", str(pki / "ours")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "https://" in done.stderr


def operator_calls(sid: str, fence: int) -> dict[str, object]:
    """One request per operator-only call (docs/design.md §4), each one that would change something."""
    return {
        "Recover": pb.RecoverRequest(session_id=sid, expected_fence=fence, reason="gone", operator="op"),
        "RecoverHost": pb.RecoverHostRequest(host_id="host-a", reason="gone", operator="op"),
        "RestoreEpoch": pb.RestoreEpochRequest(epoch=1000, operator="op", reason="restored"),
        "ArchiveSession": pb.ArchiveSessionRequest(session_id=sid, expected_fence=fence, operator="op",
                                                   reason="done"),
        "DrainHost": pb.DrainHostRequest(host_id="host-a", draining=True, operator="op"),
        "PurgeArchives": pb.PurgeArchivesRequest(older_than_seconds=0, limit=10),
    }


def test_a_runtime_certificate_cannot_make_operator_calls(
        coordinator_tls: Coordinator, tls_etcd: EtcdServer, prefix: str, pki: Path) -> None:
    """Issue 11 item 5: one runtime key must not be able to Recover (release a live owner without
    stopping it), drain, archive, purge or restore. Refused WRONG_ROLE, nothing written."""
    coordinator_as(coordinator_tls, pki, Role("agent", "host-a")).RegisterHost(registration("host-a"),
                                                                               timeout=10)
    client = coordinator_as(coordinator_tls, pki, Role("client"))
    sid = "session-roles-01"
    grant = client.Acquire(pb.AcquireRequest(session_id=sid, host_id="host-a",
                                             operation_id=secrets.token_hex(16)), timeout=10).grant
    before = etcd_state(tls_etcd, prefix, pki)
    calls = operator_calls(sid, grant.fence)
    assert set(calls) == {"Recover", "RecoverHost", "RestoreEpoch", "ArchiveSession", "DrainHost",
                          "PurgeArchives"}
    for role in (Role("client"), Role("coordinator"), Role("agent", "host-a"), Role("maintenance")):
        stub = coordinator_as(coordinator_tls, pki, role)
        for method, request in calls.items():
            if role.kind == "maintenance" and method == "PurgeArchives":
                continue  # retention is the maintenance role's one call
            err = refused(getattr(stub, method), request)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (role, method)  # type: ignore[attr-defined]
            assert reason_of(err) == "WRONG_ROLE", (role, method)  # type: ignore[arg-type]
    assert etcd_state(tls_etcd, prefix, pki) == before
    # The maintenance certificate may purge, and nothing else.
    maintenance = coordinator_as(coordinator_tls, pki, Role("maintenance"))
    assert list(maintenance.PurgeArchives(calls["PurgeArchives"], timeout=10).purged) == []
    # The operator certificate is admitted: Recover invalidates the reservation's fence.
    operator = coordinator_as(coordinator_tls, pki, Role("operator"))
    recovered = operator.Recover(calls["Recover"], timeout=10).record
    assert recovered.lease.claim_status == pb.RELEASED and recovered.lease.minimum_next_fence == 2
    assert operator.DrainHost(pb.DrainHostRequest(host_id="host-a", draining=False, operator="op"),
                              timeout=10).draining is False


def test_the_operator_commands_present_the_operator_certificate(
        coordinator_tls: Coordinator, prefix: str, pki: Path) -> None:
    coordinator_as(coordinator_tls, pki, Role("agent", "host-a")).RegisterHost(registration("host-a"),
                                                                               timeout=10)
    client = coordinator_as(coordinator_tls, pki, Role("client"))
    sid = "session-roles-02"
    grant = client.Acquire(pb.AcquireRequest(session_id=sid, host_id="host-a",
                                             operation_id=secrets.token_hex(16)), timeout=10).grant

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "holdfast.cli", *argv, "--coordinator",
                               coordinator_tls.address, "--tls-dir", str(pki / "ours")],
                              capture_output=True, text=True, timeout=60)

    as_client = cli("admin", "purge-archives", "--older-than-days", "1", "--role", "maintenance")
    assert as_client.returncode == 0, as_client.stderr
    done = cli("recover", sid, "--fence", str(grant.fence), "--reason", "lost the node")
    assert done.returncode == 0, done.stderr
    assert "invalidated" in done.stdout
    drained = cli("drain", "host-a", "--json")
    assert drained.returncode == 0, drained.stderr
    undone = cli("drain", "host-a", "--undo")
    assert undone.returncode == 0, undone.stderr


def test_a_missing_certificate_file_is_one_line_and_json_stays_json(
        coordinator_tls: Coordinator, pki: Path, tmp_path: Path) -> None:
    """A directory without operator.pem (made before the role existed): the operator commands say
    which file is missing and how to make it, exit 77, and --json still prints one JSON document."""
    older = tmp_path / "older-tls"
    older.mkdir()
    for name in ("ca.pem", "client.pem", "client.key"):
        (older / name).write_bytes((pki / "ours" / name).read_bytes())
    argv = [sys.executable, "-m", "holdfast.cli", "recover", "session-roles-03", "--fence", "1",
            "--reason", "r", "--coordinator", coordinator_tls.address, "--tls-dir", str(older)]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 77, plain.stderr
    assert plain.stderr.count("\n") == 1 and f"{older / 'operator.key'} is missing" in plain.stderr
    assert "--add-missing" in plain.stderr and "Traceback" not in plain.stderr
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 77
    assert json.loads(as_json.stdout)["error"]["reason"] == "TLS_FILE_MISSING"



def test_a_refused_client_key_is_told_to_be_fixed_not_made_again(
        coordinator_tls: Coordinator, pki: Path, tmp_path: Path) -> None:
    """A client key others may read is there but refused: the next step said to make it with `certs
    init`, which would mint a new CA; it says to fix that file."""
    loose = tmp_path / "loose-tls"
    loose.mkdir(mode=0o700)
    for name in ("ca.pem", "client.pem", "client.key"):
        (loose / name).write_bytes((pki / "ours" / name).read_bytes())
    (loose / "client.key").chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", "status", "--coordinator",
                           coordinator_tls.address, "--tls-dir", str(loose)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 77, done.stderr
    assert str(loose / "client.key") in done.stderr and "Next: fix that file as said" in done.stderr
    assert "certs init" not in done.stderr.split("Next:")[-1], done.stderr

@pytest.mark.parametrize("server", ["coordinator", "agent"])
def test_a_server_whose_key_others_may_read_stops_on_one_line_naming_it(
        server: str, tls_etcd: EtcdServer, tmp_path: Path, pki: Path) -> None:
    """A key others may read is refused at start: the server said so only as a traceback's last line,
    and under a service manager's Restart=always that is a crash loop with the fix buried. One
    fatal line naming the key and the fix, exit 2."""
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir(mode=0o700)
    for name in ("ca.pem", "coordinator.pem", "coordinator.key", "agent-host-a.pem", "agent-host-a.key"):
        (tls_dir / name).write_bytes((pki / "ours" / name).read_bytes())
        (tls_dir / name).chmod(0o644)
    (tls_dir / "etcd").mkdir(mode=0o700)  # the coordinator's etcd client files, as certs init lays them
    for name in ("ca.pem", "coordinator.pem", "coordinator.key"):
        (tls_dir / "etcd" / name).write_bytes((pki / "ours" / "etcd" / name).read_bytes())
        (tls_dir / "etcd" / name).chmod(0o600)
    key = tls_dir / f"{'coordinator' if server == 'coordinator' else 'agent-host-a'}.key"
    argv = (["coordinator", "serve", "--etcd", tls_etcd.url] if server == "coordinator"
            else ["agent", "serve", "--host-id", "host-a"])
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", *argv, "--listen", "127.0.0.1:0",
                           "--tls-dir", str(tls_dir)], capture_output=True, text=True, timeout=60)
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, said
    assert len(said) == 1 and "Traceback" not in said[0] and str(key) in said[0], said
    assert "chmod 0640" in said[0], said
