"""An owner's watch rides its grant's own call (Hold): `holdfast run` opens no WatchSessions of its
own, and hears a takeover's handoff request on that call. When the call ends under it (its
coordinator restarted), the watch goes on as a WatchSessions from the record as it is then, and a
takeover after the restart still reaches the owner. Real etcd, coordinator, agents in simulated
hosts and `run` processes; what is open is read from the coordinator's own /metrics."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.run_fixtures import Cluster, Run, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


@pytest.fixture
def coordinator(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(etcd.url, tmp_path, prefix, args=("--metrics-listen", "127.0.0.1:0")).start()
    try:
        yield server
    finally:
        server.stop()


def streams_open(coordinator: Coordinator) -> dict[str, float]:
    """holdfast_streams_open by RPC, the zeros left out."""
    with urllib.request.urlopen(f"http://{coordinator.metrics}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {s.labels["rpc"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "holdfast_streams_open" and s.value}


def started(cluster: Cluster, fence: int) -> None:
    until(f"a child at fence {fence}", lambda: [e for e in cluster.events("start") if e[1] == str(fence)])


def taken_over(cluster: Cluster, first: Run, host: SimulatedHost, sid: str) -> Run:
    """A takeover from `host`: `first` hears its handoff request and ends, and the new owner's child
    starts at fence 2, never beside the old one's."""
    second = cluster.run(host, sid, "--takeover", "--handoff-timeout", "20")
    started(cluster, 2)
    assert first.wait(30) == 0
    assert f"handoff requested by host {host.host_id}" in first.err()
    assert not cluster.events("overlap")
    return second


def test_the_owners_watch_rides_its_hold_and_goes_on_after_its_coordinator_restarts(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-hold-01"
    first = cluster.run(a, sid, "--grace", "5")
    started(cluster, 1)
    # The owner watches on its grant's call: one Hold open, and no WatchSessions at all.
    assert streams_open(cluster.coordinator) == {"Hold": 1.0}

    cluster.coordinator.stop()  # the Hold call ends under the owner (UNAVAILABLE)
    cluster.coordinator.start()  # on the same address; a new process, its gauges from zero
    until("the owner's watch back, as a WatchSessions",
          lambda: streams_open(cluster.coordinator) == {"WatchSessions": 1.0})
    assert first.proc.poll() is None

    second = taken_over(cluster, first, b, sid)
    until("the new owner watching on its Hold", lambda: streams_open(cluster.coordinator) == {"Hold": 1.0})
    os.kill(second.run_pid, signal.SIGTERM)
    assert second.wait(30) == 0
    # Its Hold let go, then a Release call: released, and nothing left open.
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED
    until("the Hold ended", lambda: streams_open(cluster.coordinator) == {})
