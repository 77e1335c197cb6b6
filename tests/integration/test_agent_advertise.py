"""An agent registered at an advertised address, behind a real loopback TCP proxy.

Coordinators dial exactly the registered address. Cutting that link, with the owner alive and
its agent running, makes the owner unknown, never dead: probes answer `unknown`, a plain run from
another host is refused 75 and starts nothing, and the record does not change. Healing the link
makes the owner provably alive again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import coordinator_pb2 as pb
from tests.faults.proxy import FaultProxy, ProxyLoop
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]
SID = "advertised-01"


@pytest.fixture
def proxy() -> Iterator[tuple[ProxyLoop, FaultProxy]]:
    loop = ProxyLoop()
    try:
        yield loop, loop.add("to-agent", "127.0.0.1:9")  # pointed at the agent once it has bound
    finally:
        loop.close()


def claim(cluster: Cluster) -> int | None:
    try:
        return cluster.record(SID).record.lease.claim_status
    except grpc.RpcError:
        return None  # not acquired yet


def verdict(cluster: Cluster) -> str:
    return cluster.stub.ProbeSession(pb.ProbeSessionRequest(session_id=SID), timeout=30).verdict


def test_a_cut_link_to_the_owners_agent_is_unknown_never_death(
        cluster: Cluster, proxy: tuple[ProxyLoop, FaultProxy], tmp_path: Path) -> None:
    loop, to_agent = proxy
    owner_host = cluster.host("host-adv", "--advertise", to_agent.address)
    bound_host, bound_port = owner_host.agent_address.rsplit(":", 1)
    to_agent.target_host, to_agent.target_port = bound_host, int(bound_port)
    hosts = cluster.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts
    registered = {h.host_id: h.address for h in hosts}
    assert registered["host-adv"] == to_agent.address != owner_host.agent_address
    other = cluster.host("host-other")

    cluster.run(owner_host, SID, cmd=["sleep", "300"])
    until("the owner live", lambda: claim(cluster) == pb.LIVE)
    assert verdict(cluster) == "held"  # attested and probed through the proxy

    loop.cut(to_agent)
    before = cluster.record(SID).record.SerializeToString()
    assert verdict(cluster) == "unknown"
    refused = cluster.run(other, SID, cmd=["touch", str(tmp_path / "second-writer")])
    assert refused.wait(60) == 75 and "OWNERSHIP_UNKNOWN" in refused.err()
    assert not (tmp_path / "second-writer").exists()
    assert cluster.record(SID).record.SerializeToString() == before  # a refusal writes nothing

    loop.heal(to_agent)
    until("the owner provably alive again", lambda: verdict(cluster) == "held", timeout=30)
