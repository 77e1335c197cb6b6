"""`holdfast agent serve --coordinator`: registers, keeps serving while the coordinator is away,
re-registers when its registration lapses."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
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


def test_agent_registers_the_address_it_bound_never_one_in_its_ready_file(
    coordinator: Coordinator, tmp_path
) -> None:
    """A ready file already there — the previous run's, or one another user put in a shared
    directory — was read back and registered before the agent had written its own: coordinators
    then dialled 127.0.0.1:9 for this host."""
    ready = tmp_path / "agent.json"
    ready.write_text('{"address": "127.0.0.1:9"}')
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - the agent's for its whole life
    agent = subprocess.Popen([sys.executable, "-m", "holdfast.cli", "agent", "serve",
                              "--listen", "127.0.0.77:0", "--host-id", "host-ready",
                              "--coordinator", coordinator.address, "--ready-file", str(ready)],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_until("registration", lambda: [h.host_id for h in listed(coordinator)] == ["host-ready"])
        own = json.loads(ready.read_text())["address"]
        assert own.startswith("127.0.0.77:")
        assert listed(coordinator)[0].address == own
    finally:
        agent.terminate()
        agent.wait(10)
        log.close()
