"""A grant is bound to its holdfast cluster (issue 17, safety 1, defence in depth): coordinators over
one etcd keyspace share one identity, another keyspace has another; a write carrying another
cluster's grant is refused WRONG_CLUSTER and writes nothing; an older client's empty id is accepted;
the client library keeps the identity in the grant file and refuses an answer from another cluster.
Real etcd, real `holdfast coordinator serve` processes, real gRPC."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.common.reasons import reason_of
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator, snapshot

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(120)

HOST = "host-cluster-id"


@pytest.fixture
def other(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    """A second holdfast cluster: the same etcd, another prefix (another fence space)."""
    (tmp_path / "other").mkdir()
    server = Coordinator(etcd.url, tmp_path / "other", prefix + "other/").start()
    try:
        yield server
    finally:
        server.stop()


def stub(address: str) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(address))


def registered(coord: coordinator_pb2_grpc.CoordinatorStub) -> coordinator_pb2_grpc.CoordinatorStub:
    # Routing only: a grant of a free session probes nothing, so no agent needs to answer here.
    reg = pb.HostRegistration(host_id=HOST, address="127.0.0.1:9", spawn_token_env="HOLDFAST_SPAWN_TOKEN")
    coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=30), timeout=10)
    return coord


def grant_of(coord: coordinator_pb2_grpc.CoordinatorStub, session: str) -> pb.Grant:
    request = pb.AcquireRequest(session_id=session, host_id=HOST, operation_id=secrets.token_hex(16),
                                live_on_commit=True)
    return coord.Acquire(request, timeout=10).grant


def test_one_keyspace_one_identity_another_keyspace_another(etcd: EtcdServer, coordinator: Coordinator,
                                                            other: Coordinator, tmp_path: Path,
                                                            prefix: str) -> None:
    (tmp_path / "replica").mkdir()
    replica = Coordinator(etcd.url, tmp_path / "replica", prefix).start()
    try:
        first = grant_of(registered(stub(coordinator.address)), "cluster-id-one")
        second = grant_of(stub(replica.address), "cluster-id-two")
    finally:
        replica.stop()
    elsewhere = grant_of(registered(stub(other.address)), "cluster-id-one")
    assert len(first.cluster_id) == 32 and first.cluster_id == second.cluster_id
    assert elsewhere.cluster_id and elsewhere.cluster_id != first.cluster_id
    stored = dict(snapshot(etcd.url, prefix))[prefix + "cluster-id"]
    assert stored.decode() == first.cluster_id  # readable with etcdctl, written once


def test_another_clusters_grant_is_refused_and_writes_nothing(etcd: EtcdServer, coordinator: Coordinator,
                                                              other: Coordinator, prefix: str) -> None:
    mine = registered(stub(coordinator.address))
    theirs = registered(stub(other.address))
    sid = "cluster-id-refused"
    grant = grant_of(mine, sid)
    local = grant_of(theirs, sid)  # the same session id and fence in the other cluster
    assert (grant.fence, local.fence) == (1, 1)
    before = snapshot(etcd.url, prefix + "other/")
    ident = {"session_id": sid, "fence": 1, "secret": local.secret, "cluster_id": grant.cluster_id}
    calls = [(theirs.CommitOwner, pb.CommitOwnerRequest(**ident, pid_hint=1)),
             (theirs.Release, pb.ReleaseRequest(**ident)),
             (theirs.FencedPut, pb.FencedPutRequest(**ident, key="k", value=b"v")),
             (theirs.RecordProviderHandle, pb.RecordProviderHandleRequest(**ident, handle="h"))]
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        assert reason_of(refused.value) == "WRONG_CLUSTER", request  # type: ignore[arg-type]
    assert snapshot(etcd.url, prefix + "other/") == before
    # An older client sends no cluster id: accepted, and the answer names the cluster.
    released = theirs.Release(pb.ReleaseRequest(session_id=sid, fence=1, secret=local.secret), timeout=10)
    assert released.record.lease.claim_status == pb.RELEASED and released.cluster_id == local.cluster_id


def test_client_keeps_the_identity_and_refuses_another_clusters_answers(coordinator: Coordinator,
                                                                        tmp_path: Path) -> None:
    registered(stub(coordinator.address))

    async def body() -> None:
        async with Client(coordinator.address, HOST) as client:
            grant, _ = await client.acquire("cluster-id-client", secrets.token_hex(16))
            assert len(grant.cluster_id) == 32
            held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
            grant.write(held)
            os.close(held)
            kept = Grant.from_file(tmp_path / GRANT_FILE)
            assert kept == grant and kept.cluster_id == grant.cluster_id
            forged = dataclasses.replace(grant, cluster_id="0" * 32)
            with pytest.raises(ClientError) as refused:
                await client.release(forged)
            assert refused.value.reason == "WRONG_CLUSTER" and refused.value.exit_code == 69
            # A watch carries no grant to the coordinator: the client itself checks each event.
            with pytest.raises(ClientError) as watched:
                async for _record in client.watch(grant.session_id, forged):
                    pass
            assert watched.value.reason == "WRONG_CLUSTER"
            # An owner's watch from its grant's revision lists nothing: its opening event says who answers.
            with pytest.raises(ClientError) as watched:
                async for _record in client.watch(grant.session_id, forged, grant.revision):
                    pass
            assert watched.value.reason == "WRONG_CLUSTER"
            assert (await client.release(grant)).lease.claim_status == pb.RELEASED

    asyncio.run(asyncio.wait_for(body(), 50))


def test_a_grant_file_from_before_the_field_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "grant.json"
    path.write_text('{"session_id": "s-old-grant", "fence": 3, "secret": "x", "spawn_token": "t", '
                    '"spawn_token_env": "HOLDFAST_SPAWN_TOKEN", "coordinator": "127.0.0.1:7420"}')
    path.chmod(0o600)  # as `run` wrote it
    assert Grant.from_file(path).cluster_id == ""
