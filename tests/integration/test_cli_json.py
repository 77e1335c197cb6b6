"""Every command's --json is one parseable JSON document — answers and errors alike — against a
real coordinator, etcd and agents; the child of `run` makes fenced writes with `put`/`handle`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import signals_as_at_a_terminal
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]

HOLDFAST = [sys.executable, "-m", "holdfast.cli"]


def cli(cluster: Cluster, *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = subprocess.run([*HOLDFAST, *argv, "--coordinator", cluster.coordinator.address],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


def test_every_read_command_json_parses(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    sid = "sess-json-0001"
    out = cluster.tmp / "child.json"
    # Inside the run: a fenced put and a provider handle, both with --json.
    child = f"{sys.executable} -m holdfast.cli put greeting hello --json > {out}.put && " \
            f"{sys.executable} -m holdfast.cli handle thread-1 --json > {out}.handle"
    run = cluster.run(a, sid, cmd=["sh", "-c", child])
    assert run.wait(30) == 0, run.err()
    put = json.loads(Path(f"{out}.put").read_text())
    assert put["fence"] == 1 and put["revision"] > 0
    handle = json.loads(Path(f"{out}.handle").read_text())
    assert handle["provider_handle_chain"][0]["handle"] == "thread-1"

    code, got = cli(cluster, "get", "greeting", "--session", sid, "--json")
    assert code == 0 and got["value"] == "hello" and got["found"] is True
    code, status = cli(cluster, "status", "--json")
    assert code == 0 and [h["host_id"] for h in status["hosts"]] == ["host-a"]
    assert [s["session_id"] for s in status["sessions"]] == [sid]
    code, hosts = cli(cluster, "hosts", "--json")
    assert code == 0 and hosts["hosts"][0]["address"] == a.agent_address
    code, shown = cli(cluster, "show", sid, "--json")
    assert code == 0 and shown["record"]["lease"]["claim_status"] == "RELEASED"
    assert [h["transition"] for h in shown["history"]] == ["grant", "provider-handle", "release"]
    # Integers below 2**53 are numbers (the proto3 mapping wrote "1"); an etcd lease id, which may
    # exceed it, stays a string; every document names its schema (docs/json.md).
    assert [h["seq"] for h in shown["history"]] == [1, 2, 3]
    assert shown["record"]["lease"]["fence"] == 1 and shown["record"]["history_seq"] == 3
    assert isinstance(hosts["hosts"][0]["lease_id"], str) and int(hosts["hosts"][0]["lease_id"]) > 0
    assert isinstance(hosts["hosts"][0]["registered_at_unix_ms"], int)
    assert {d["schema"] for d in (put, handle, got, status, hosts, shown)} == {"holdfast/v1"}
    code, probed = cli(cluster, "probe", sid, "--json")
    assert code == 0 and probed["verdict"] == "free"
    code, recovered = cli(cluster, "recover", sid, "--fence", "1", "--reason", "test", "--json")
    assert code == 0 and recovered["lease"]["death_evidence"]["kind"] == "operator-asserted"
    # Errors are JSON too, with the reason and the next step.
    code, missing = cli(cluster, "show", "sess-json-none", "--json")
    assert code == 1 and missing["error"]["reason"] == "NOT_FOUND" and missing["schema"] == "holdfast/v1"
    assert "holdfast status" in missing["error"]["next_step"]
    code, stale = cli(cluster, "recover", sid, "--fence", "2", "--reason", "not the current fence", "--json")
    assert code == 75 and stale["error"]["reason"] == "STALE_FENCE"
    code, absent = cli(cluster, "get", "nothing", "--session", sid, "--json")
    assert code == 1 and absent["found"] is False


def test_probe_exits_with_its_verdict(cluster: Cluster) -> None:
    """Issue 17: probe exited 0 for held, free and unknown alike. 0 free, 3 held, 4 unknown, with
    and without --json (docs/operations.md)."""
    a = cluster.host("host-a")
    sid = "sess-probe-0001"
    cluster.run(a, sid)
    until("the child's start", lambda: cluster.events("start"))

    def probe() -> tuple[int, int, str]:
        text = subprocess.run([*HOLDFAST, "probe", sid, "--coordinator", cluster.coordinator.address],
                              capture_output=True, text=True, timeout=60)
        code, found = cli(cluster, "probe", sid, "--json")
        return text.returncode, code, found["verdict"]

    assert probe() == (3, 3, "held")
    # Its host gone with its agent: the registration is still live, nothing answers — unknown.
    a.stop()
    assert probe() == (4, 4, "unknown")
    lease = cluster.record(sid).record.lease
    code, _ = cli(cluster, "recover", sid, "--fence", str(lease.fence), "--reason", "host stopped", "--json")
    assert code == 0
    assert probe() == (0, 0, "free")
    said = subprocess.run([*HOLDFAST, "probe", sid, "--coordinator", cluster.coordinator.address],
                          capture_output=True, text=True, timeout=60).stdout
    assert said == f"{sid}: free — no owner to ask (released at fence 1)\n"  # not "no reason given"


def test_recover_of_an_owner_proven_alive_needs_yes(cluster: Cluster) -> None:
    """Issue 17: recover of an owner its agent proves alive was accepted without a word."""
    a = cluster.host("host-a")
    sid = "sess-recover-alive"
    cluster.run(a, sid)
    until("the child's start", lambda: cluster.events("start"))
    before = cluster.record(sid)
    code, refused = cli(cluster, "recover", sid, "--fence", "1", "--reason", "sure?", "--json")
    assert code == 75 and refused["error"]["reason"] == "OWNER_ALIVE"
    assert "proven alive" in refused["error"]["message"] and "--yes" in refused["error"]["next_step"]
    assert cluster.record(sid) == before
    code, recovered = cli(cluster, "recover", sid, "--fence", "1", "--reason", "sure", "--yes", "--json")
    assert code == 0 and recovered["lease"]["claim_status"] == "RELEASED"


def test_status_watch_lists_then_streams_each_change_until_interrupted(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    first = cluster.run(a, "sess-watch-001", cmd=["true"])
    assert first.wait(30) == 0, first.err()
    env = {**os.environ, "HOLDFAST_COORDINATOR": cluster.coordinator.address}

    table_err = cluster.tmp / "status-w.err"
    with signals_as_at_a_terminal():  # Ctrl-C must reach them, as at a terminal
        watch = subprocess.Popen([*HOLDFAST, "status", "--watch", "--json"], stdout=subprocess.PIPE,
                                 text=True, env=env)
        table = subprocess.Popen([*HOLDFAST, "status", "-w"], stdout=subprocess.PIPE, text=True, env=env,
                                 stderr=table_err.open("wb"))
    try:
        assert watch.stdout is not None and table.stdout is not None
        listed = json.loads(watch.stdout.readline())
        assert (listed["event"], listed["session_id"]) == ("listed", "sess-watch-001")
        assert listed["record"]["lease"]["claim_status"] == "RELEASED"
        header = table.stdout.readline()
        assert header.split()[:3] == ["SESSION", "HOST", "INCARNATION"], (header, table.poll(),
                                                                          table_err.read_text())
        assert table.stdout.readline().split()[0] == "sess-watch-001"
        # Each transition of a new run arrives as it happens: its grant (committing it: live), release.
        second = cluster.run(a, "sess-watch-002", cmd=["true"])
        assert second.wait(30) == 0, second.err()
        seen = [json.loads(watch.stdout.readline()) for _ in range(2)]
        assert [(e["event"], e["session_id"], e["record"]["lease"]["claim_status"]) for e in seen] == [
            ("changed", "sess-watch-002", "LIVE"), ("changed", "sess-watch-002", "RELEASED")]
        rows = [table.stdout.readline().split() for _ in range(2)]
        assert [(r[0], r[5]) for r in rows] == [("sess-watch-002", "live"), ("sess-watch-002", "released")]
        for proc in (watch, table):
            proc.send_signal(signal.SIGINT)  # Ctrl-C ends a watch quietly, with 0
            assert proc.wait(30) == 0
    finally:
        for proc in (watch, table):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
