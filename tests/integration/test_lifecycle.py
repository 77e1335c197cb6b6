"""Archive, drain, bulk recovery and size limits against a real etcd, coordinator, agents in
simulated hosts and real `holdfast run` children. A refusal is checked to have written nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from holdfast.client.grant import Grant
from holdfast.common.reasons import reason_of
from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants
from tests.integration.lifecycle_helpers import cli, fenced_put_reason, grant_copier
from tests.integration.run_fixtures import CHILD, Cluster, until
from tests.integration.test_run_sessions import gone, started

HOLDFAST = [sys.executable, "-m", "holdfast.cli"]

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
DISK = "disk died"


def owned_grant(cluster: Cluster, host, session: str, tmp: Path, name: str):  # type: ignore[no-untyped-def]
    path = tmp / f"{name}.json"
    run = cluster.run(host, session, cmd=grant_copier(path))
    until(f"grant file {name}", path.exists)
    return run, Grant.from_file(path)


def child(cluster: Cluster, session: str) -> list[str]:
    """The overlap child with a lock file of this session's own (sessions do not exclude each other)."""
    return [sys.executable, CHILD, str(cluster.tmp / f"{session}.lock"), str(cluster.tmp / "session.log")]


def raw_revision(cluster: Cluster, session: str) -> str:
    return cluster.record(session).SerializeToString().hex()


def test_archive_only_without_a_live_owner_keeps_history_and_floors_the_fence(
        cluster: Cluster, tmp_path: Path) -> None:
    host = cluster.host("host-arch")
    sid = "sess-archive-01"
    run, grant = owned_grant(cluster, host, sid, tmp_path, "g1")
    assert fenced_put_reason(cluster.stub, grant, "notes/a") == ""
    before = raw_revision(cluster, sid)
    # A live owner, proven alive by its agent: refused, nothing written.
    code, out = cli(cluster.coordinator.address, "admin", "archive", sid, "--fence", "1", "--reason", "done")
    assert code == 75 and out["error"]["reason"] == "HELD", out
    code, out = cli(cluster.coordinator.address, "admin", "archive", sid, "--fence", "7", "--reason", "done")
    assert out["error"]["reason"] == "STALE_FENCE" and "holdfast show" in out["error"]["next_step"]
    assert raw_revision(cluster, sid) == before
    os.kill(run.run_pid, signal.SIGTERM)
    assert run.wait(30) == 128 + signal.SIGTERM  # `run` exits with its CMD's status (sleep, ended)
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED

    code, out = cli(cluster.coordinator.address, "admin", "archive", sid, "--fence", "1", "--reason", "done")
    assert code == 0 and out["verdict"] == "FREE", out
    with pytest.raises(grpc.RpcError) as err:
        cluster.record(sid)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    got = cluster.stub.FencedGet(pb.FencedGetRequest(session_id=sid, key="notes/a"), timeout=5)
    assert not got.found  # fenced data ends with the session
    code, out = cli(cluster.coordinator.address, "admin", "archived", sid)
    assert code == 0
    assert [h["transition"] for h in out["history"]] == ["grant", "release"]  # committed by its grant
    assert out["record"]["lease"]["death_evidence"]["kind"] == "archived"

    # Retention: a bounded sweep drops archived history older than the age; the fence floor stays.
    code, out = cli(cluster.coordinator.address, "admin", "purge-archives", "--older-than-days", "1")
    # Archived just now: not due.
    assert code == 0 and out == {"schema": "holdfast/v1", "purged": [], "more": False}
    code, out = cli(cluster.coordinator.address, "admin", "purge-archives", "--older-than-days", "0")
    assert code == 0 and out["purged"] == [sid], out
    code, out = cli(cluster.coordinator.address, "admin", "archived", sid)
    assert "history" not in out and out["record"]["lease"]["fence"] == 1
    code, out = cli(cluster.coordinator.address, "admin", "purge-archives", "--older-than-days", "-1")
    assert code == 2
    # The same id again starts above the archived fence: no grant number is ever reused.
    run2, grant2 = owned_grant(cluster, host, sid, tmp_path, "g2")
    assert grant2.fence == 2
    assert fenced_put_reason(cluster.stub, grant, "notes/a") == "STALE_FENCE"
    os.kill(run2.run_pid, signal.SIGTERM)
    run2.wait(30)


def test_drain_hands_off_every_session_and_refuses_new_grants_there(cluster: Cluster) -> None:
    a, b = cluster.host("host-dra"), cluster.host("host-drb")
    sessions = ["sess-drain-001", "sess-drain-002"]
    runs = [cluster.run(a, sid, cmd=child(cluster, sid)) for sid in sessions]
    until("both children", lambda: len(cluster.events("start")) == 2)
    code, out = cli(cluster.coordinator.address, "drain", "host-dra")
    assert code == 75 and sorted(out["handoff_requested"]) == sorted(out["still_owned"]) == sessions, out
    # Again, as text, waiting: what was done first, then the progress (a line at each change), and
    # nothing is left held.
    shown = subprocess.run([*HOLDFAST, "drain", "host-dra", "--wait", "30", "--coordinator",
                            cluster.coordinator.address], capture_output=True, text=True, timeout=60)
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and lines[0].startswith("host host-dra: draining (no new grants there)")
    assert all(line.startswith("drain host-dra: ") for line in lines[1:]), lines
    assert lines[1:] == [] or lines[-1] == "drain host-dra: 0 sessions still held"
    for run in runs:
        assert run.wait(30) == 0  # the children were ended gracefully by their own `run`
    for sid in sessions:
        # Released, the drain's request is answered: no record stays `handoff-requested`.
        lease = cluster.record(sid).record.lease
        assert (lease.claim_status, lease.handoff_stage) == (pb.RELEASED, pb.NONE)
    refused = cluster.run(a, sessions[0], cmd=child(cluster, sessions[0]))
    assert refused.wait(30) == 75 and "HOST_DRAINING" in refused.err()
    assert cluster.record(sessions[0]).record.lease.fence == 1  # the refusal wrote nothing
    moved = cluster.run(b, sessions[0], cmd=child(cluster, sessions[0]))
    started(cluster, 2)
    assert cluster.record(sessions[0]).record.lease.owner.host_id == "host-drb"
    code, out = cli(cluster.coordinator.address, "drain", "host-dra", "--undo")
    assert code == 0 and out["draining"] is False
    back = cluster.run(a, sessions[1], cmd=child(cluster, sessions[1]))
    until("a grant on the undrained host", lambda: [e for e in cluster.events("start") if e[2] == "host-dra"
                                                    and e[1] == "2"])
    assert not cluster.events("overlap")
    for run in (moved, back):
        os.kill(run.run_pid, signal.SIGTERM)
        run.wait(30)


def test_recover_host_refused_while_registered_then_frees_every_session(
        cluster: Cluster, tmp_path: Path) -> None:
    # A 3 s registration: the test waits for it to lapse (a heartbeat every second keeps it till then).
    a, b = cluster.host("host-gone", "--registration-ttl", "3"), cluster.host("host-next")
    sid1, sid2 = "sess-gone-0001", "sess-gone-0002"
    _, g1 = owned_grant(cluster, a, sid1, tmp_path, "r1")
    _, g2 = owned_grant(cluster, a, sid2, tmp_path, "r2")
    before = raw_revision(cluster, sid1)
    code, out = cli(cluster.coordinator.address, "admin", "recover-host", "host-gone", "--reason", DISK)
    assert out["error"]["reason"] == "HOST_LIVE" and "drain" in out["error"]["message"], out
    # The hint fits recover-host (the table's is a second agent's, at registration).
    assert "`holdfast drain host-gone`" in out["error"]["next_step"], out
    assert "another agent holds" not in out["error"]["next_step"], out
    assert raw_revision(cluster, sid1) == before
    # The node goes away for good; its registration lapses after its TTL (time grants nothing by
    # itself: it only ends the agent's own claim to answer).
    tree = [p for r in cluster.runs for p in (r.run_pid, *descendants(r.run_pid))]
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    a.stop()
    until("the registration to lapse", lambda: not any(
        h.host_id == "host-gone" for h in cluster.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts), 30)
    probe = cluster.stub.ProbeSession(pb.ProbeSessionRequest(session_id=sid1), timeout=30)
    assert probe.verdict == "unknown"  # nothing can prove it dead: indeterminate
    code, out = cli(cluster.coordinator.address, "admin", "recover-host", "host-gone", "--reason", DISK)
    assert code == 0 and out["recovered"] == 2 and out["failed"] == 0, out
    for sid, grant in ((sid1, g1), (sid2, g2)):
        lease = cluster.record(sid).record.lease
        assert lease.claim_status == pb.RELEASED and lease.death_evidence.kind == "operator-asserted"
        assert "disk died" in lease.death_evidence.detail
        assert fenced_put_reason(cluster.stub, grant, "k") in ("STALE_FENCE", "NOT_LIVE")
    assert all(gone(pid) for pid in tree)
    moved = cluster.run(b, sid1)
    started(cluster, 2)
    os.kill(moved.run_pid, signal.SIGTERM)
    moved.wait(30)


def test_oversized_fenced_value_refused_naming_the_limit(cluster: Cluster, tmp_path: Path) -> None:
    host = cluster.host("host-big")
    run, grant = owned_grant(cluster, host, "sess-bigvalue1", tmp_path, "big")
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.FencedPut(pb.FencedPutRequest(
            session_id=grant.session_id, fence=grant.fence, secret=grant.secret, key="blob",
            value=b"x" * (records.MAX_VALUE_BYTES + 1)), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(err.value) == "INVALID_ARGUMENT"  # type: ignore[arg-type]
    assert str(records.MAX_VALUE_BYTES) in err.value.details() and "etcd" in err.value.details()
    got = cluster.stub.FencedGet(pb.FencedGetRequest(session_id=grant.session_id, key="blob"), timeout=5)
    assert not got.found
    # At the limit it fits one etcd request.
    cluster.stub.FencedPut(pb.FencedPutRequest(
        session_id=grant.session_id, fence=grant.fence, secret=grant.secret, key="blob",
        value=b"x" * records.MAX_VALUE_BYTES), timeout=10)
    os.kill(run.run_pid, signal.SIGTERM)
    run.wait(30)
