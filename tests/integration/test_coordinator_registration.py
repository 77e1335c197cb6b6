"""`holdfast agent serve --coordinator`: registers, keeps serving while the coordinator is away,
re-registers when its registration lapses."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import pytest

from holdfast.coordinator.store import Store
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


def listed(coordinator: Coordinator) -> list[pb.HostRegistration]:
    stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
    return list(stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts)


def wait_until(what: str, cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_agent_registers_survives_coordinator_outage_and_reregisters(
    coordinator: Coordinator, etcd, prefix, tmp_path
) -> None:
    host = SimulatedHost("host-reg", 52, tmp_path / "h", agent_args=["--coordinator", coordinator.address])
    with host:
        wait_until("registration", lambda: [h.host_id for h in listed(coordinator)] == ["host-reg"])
        first = listed(coordinator)[0]
        assert first.address == host.agent_address and first.incarnation.boot_id
        coordinator.stop()
        agent = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(host.agent_address))
        assert agent.GetHostInfo(apb.GetHostInfoRequest(), timeout=5).host_id == "host-reg"
        coordinator.start()
        assert [h.host_id for h in listed(coordinator)] == ["host-reg"]

        async def revoke() -> None:
            store = Store.connect(etcd.url, prefix=prefix)
            try:
                await store.revoke_lease(first.lease_id)
            finally:
                await store.close()

        asyncio.run(revoke())
        wait_until(
            "re-registration", lambda: [h.lease_id for h in listed(coordinator)] not in ([], [first.lease_id])
        )
