"""An etcd outage reaches clients as UNAVAILABLE, and the coordinator serves again once etcd is back."""

from __future__ import annotations

import secrets

import grpc
import pytest

from holdfast.common.reasons import reason_of
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator

pytestmark = pytest.mark.timeout(60)


def test_etcd_outage_is_unavailable_and_nothing_is_half_written(tmp_path) -> None:
    etcd = EtcdServer(tmp_path / "etcd", fast_election=True).start()
    coordinator = Coordinator(etcd.url, tmp_path, "/holdfast/v1/").start()
    try:
        coord = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
        reg = pb.HostRegistration(
            host_id="host-out", address="127.0.0.97:1", spawn_token_env="HOLDFAST_SPAWN_TOKEN"
        )
        coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=60), timeout=10)
        port = etcd.client_port
        etcd.stop()
        request = pb.AcquireRequest(
            session_id="session-outage", host_id="host-out", operation_id=secrets.token_hex(16)
        )
        with pytest.raises(grpc.RpcError) as info:
            coord.Acquire(request, timeout=20)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert reason_of(info.value) == "UNAVAILABLE"  # type: ignore[arg-type]
        etcd.client_port = port
        etcd.start()
        with pytest.raises(grpc.RpcError) as info:
            coord.GetSession(pb.GetSessionRequest(session_id="session-outage"), timeout=20)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    finally:
        coordinator.stop()
        etcd.stop()
