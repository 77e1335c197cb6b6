"""`holdfast run --report FILE` (issue 17): a CMD that itself exits 75 is told apart from a refusal
with 75, by one JSON document written whole when `run` ends. Real etcd, coordinator and agents."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]

KEYS = {"schema", "ran", "exit_code", "cmd_status", "reason", "message", "next_step", "session", "fence"}


def report(path: Path) -> dict:  # type: ignore[type-arg]
    got = json.loads(path.read_text())
    assert set(got) == KEYS
    assert not list(path.parent.glob(f".{path.name}.*.tmp"))  # written by rename, nothing left over
    return got  # type: ignore[no-any-return]


def test_a_cmd_exiting_75_itself_is_not_a_refusal_and_a_refusal_is_not_cmd(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    own = cluster.tmp / "own75.json"
    ran = cluster.run(a, "sess-report-75", "--report", str(own), cmd=["sh", "-c", "exit 75"])
    assert ran.wait(30) == 75, ran.err()
    assert report(own) == {"schema": "holdfast/v1", "ran": True, "exit_code": 75, "cmd_status": 75,
                           "reason": "", "message": "", "next_step": "", "session": "sess-report-75",
                           "fence": 1}

    sid = "sess-report-held"
    holder = cluster.run(a, sid)
    until("the holder's child", lambda: cluster.events("start"))
    refused_path = cluster.tmp / "held.json"
    refused = cluster.run(b, sid, "--report", str(refused_path), cmd=["sh", "-c", "exit 0"])
    assert refused.wait(30) == 75
    got = report(refused_path)
    assert (got["ran"], got["exit_code"], got["cmd_status"], got["reason"], got["fence"]) == (
        False, 75, None, "HELD", 0)
    assert "host-a" in got["message"] and got["next_step"] and got["session"] == sid
    assert holder.proc.poll() is None  # the holder was never disturbed


def test_a_report_that_cannot_be_written_is_refused_before_any_call(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    run = cluster.run(a, "sess-report-nodir", "--report", str(cluster.tmp / "no" / "such" / "r.json"),
                      cmd=["sh", "-c", "exit 0"])
    assert run.wait(30) == 2 and "--report" in run.err()
    sessions = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10).records
    assert not [s for s in sessions if s.session_id == "sess-report-nodir"]  # nothing was asked


def test_a_report_is_never_written_through_a_link_planted_at_its_name(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    victim = cluster.tmp / "victim"
    victim.write_text("kept")
    shared = cluster.tmp / "shared"
    shared.mkdir(mode=0o1777)  # a directory others write too, as /tmp is
    (shared / "r.json").symlink_to(victim)  # planted by another user before root's run ends
    ran = cluster.run(a, "sess-report-link", "--report", str(shared / "r.json"), cmd=["true"])
    assert ran.wait(30) == 0, ran.err()
    assert victim.read_text() == "kept"
    assert not (shared / "r.json").is_symlink() and report(shared / "r.json")["exit_code"] == 0
