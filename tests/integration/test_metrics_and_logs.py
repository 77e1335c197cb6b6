"""/metrics on both servers after real traffic (real etcd, coordinator, agent in a simulated host,
`holdfast run`), and the coordinator's JSON log lines carrying session, fence and host."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def coordinator(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(etcd.url, tmp_path, prefix,
                         args=("--metrics-listen", "127.0.0.1:0", "--census-seconds", "0.2")).start()
    try:
        yield server
    finally:
        server.stop()


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def agent_metrics_address(cluster: Cluster, host_id: str) -> str:
    host = cluster.hosts[host_id]
    ready = host.state_dir / f"agent-{host_id}-{host.incarnations - 1}.json"
    return json.loads(ready.read_text())["metrics"]


def test_counters_move_with_real_traffic_and_logs_name_the_session(cluster: Cluster, tmp_path: Path) -> None:
    coordinator = cluster.coordinator
    assert coordinator.metrics
    before = scrape(coordinator.metrics)
    assert value(before, "holdfast_grants_total", reason="FREE") == 0
    host = cluster.host("host-m", "--metrics-listen", "127.0.0.1:0")
    agent = agent_metrics_address(cluster, "host-m")
    sid = "sess-metrics-01"
    cluster.run(host, sid)
    until("the child", lambda: cluster.events("start"))
    refused = cluster.run(host, sid)
    assert refused.wait(30) == 75  # HELD: the owner's agent proved it alive

    after = until("the census", lambda: (lambda s: s if value(
        s, "holdfast_sessions", claim_status="live", handoff_stage="none") == 1 else None)(
        scrape(coordinator.metrics)))
    assert isinstance(after, dict)
    assert value(after, "holdfast_grants_total", reason="FREE") == 1
    assert value(after, "holdfast_refusals_total", rpc="Hold", reason="HELD") >= 1  # `run` acquires by Hold
    assert value(after, "holdfast_probes_total", host="host-m", outcome="identity_matched") >= 1
    assert value(after, "holdfast_probe_seconds_count", host="host-m") >= 1
    assert value(after, "holdfast_host_registered", host="host-m") == 1

    seen = scrape(agent)
    assert value(seen, "holdfast_agent_probes_total", host="host-m", outcome="identity_matched") >= 1
    assert value(seen, "holdfast_agent_probe_seconds_count", host="host-m") >= 1
    # Probes of a live owner read no tree (agent.service.ProbeOwners): no scan yet.
    assert value(seen, "holdfast_agent_scan_seconds_count") == 0
    assert value(seen, "holdfast_agent_registered", host="host-m") == 1

    # A takeover: the owner lets go, and the taker's Acquire is timed from its call to its grant.
    assert not [k for k in after if k[0] == "holdfast_takeover_seconds_count"]
    cluster.run(host, sid, "--takeover", "--handoff-timeout", "20")
    until("the child at fence 2", lambda: [e for e in cluster.events("start") if e[1] == "2"])
    took = scrape(coordinator.metrics)
    assert sum(v for (name, _), v in took.items() if name == "holdfast_takeover_seconds_count") == 1
    # The release before it was proven by the owner's tree, gone: a scan of the whole simulated host.
    scanned = scrape(agent)
    assert value(scanned, "holdfast_agent_scans_total", complete="true") >= 1
    assert value(scanned, "holdfast_agent_scan_seconds_count") >= 1
    assert value(scanned, "holdfast_agent_scan_unreadable_processes") == 0

    # The owner's host goes away: asking about the session is now indeterminate, and the gauge says so.
    host.stop()
    probe = cluster.stub.ProbeSession(pb.ProbeSessionRequest(session_id=sid), timeout=30)
    assert probe.verdict == "unknown"
    late = scrape(coordinator.metrics)
    assert value(late, "holdfast_probes_total", host="host-m", outcome="indeterminate") >= 1
    assert ("holdfast_session_indeterminate_seconds", frozenset({("session", sid)})) in late

    lines = [json.loads(line) for line in (tmp_path / "coordinator.log").read_text().splitlines()
             if line.startswith("{")]
    about = [e for e in lines if e.get("session") == sid]
    assert {e["transition"] for e in about} >= {"grant"}  # a run is committed by its grant
    assert all(e["fence"] in (1, 2) and e["host"] == "host-m" for e in about)
    assert not any(s in line for line in map(json.dumps, lines) for s in ("secret", "spawn_token"))
