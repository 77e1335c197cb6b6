"""Commit at grant (docs/design.md §2), with real agents in simulated hosts, a real coordinator and
etcd: a `run` spawns its gate first and its grant commits it; a process is attested only for the
caller holding the secret of the token it carries; a gate that cannot be attested refuses the
Acquire before anything is written, signalled or asked of an owner; a run guessing the wrong token
variable falls back to a reservation and CommitOwner."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import grpc
import pytest

from holdfast.common import spawn_tokens
from holdfast.common.reasons import reason_of
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster
from tests.integration.test_run_sessions import frozen_owner, gone, started

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
VAR = spawn_tokens.DEFAULT_VARIABLE


def transitions(cluster: Cluster, sid: str) -> list[str]:
    return [entry.transition for entry in cluster.record(sid).history]


def refused(cluster: Cluster, request: pb.AcquireRequest) -> str:
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Acquire(request, timeout=30)
    return reason_of(err.value)  # type: ignore[arg-type]


def test_a_run_is_committed_by_its_grant(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    sid = "sess-commit-at-grant"
    run = cluster.run(a, sid)
    started(cluster, 1)
    lease = cluster.record(sid).record.lease
    assert lease.claim_status == pb.LIVE and lease.owner.cgroup.path, "attested into a session cgroup"
    assert lease.reserved_spawn_token == lease.owner.spawn_token
    assert "grant" in transitions(cluster, sid) and "commit" not in transitions(cluster, sid)
    os.kill(run.run_pid, signal.SIGTERM)
    assert run.wait(30) == 0


def test_a_run_guessing_another_token_variable_commits_a_reservation(cluster: Cluster) -> None:
    a = cluster.host("host-a")
    sid = "sess-other-variable"
    run = cluster.run(a, sid, env={spawn_tokens.VARIABLE_ENV: "NOT_THE_AGENTS_VARIABLE"})
    started(cluster, 1)
    lease = cluster.record(sid).record.lease
    assert lease.claim_status == pb.LIVE and lease.owner.spawn_token_env == VAR
    assert transitions(cluster, sid)[-2:] == ["grant", "commit"]
    os.kill(run.run_pid, signal.SIGTERM)
    assert run.wait(30) == 0


def test_a_process_is_attested_only_for_the_secret_of_its_token(cluster: Cluster) -> None:
    """Any process of a user can read another's token in its environ; the secret it derives from
    is in no environ. Naming a process with the token as a secret, or any other secret, is refused,
    writes nothing and leaves the process in its cgroup; only its own secret makes it an owner."""
    a = cluster.host("host-a")
    sid = "sess-named-gate"
    secret = spawn_tokens.mint_spawn_secret()
    token = spawn_tokens.spawn_token_for(secret)
    victim = a.spawn(["sleep", "600"], env={**os.environ, VAR: token})
    try:
        pid, outer = a.host_pid(victim), a.outer_pid(victim)
        before = Path(f"/proc/{outer}/cgroup").read_text()
        for guess in (spawn_tokens.mint_spawn_secret(), token + token):
            gate = pb.GateSpawn(pid_hint=pid, token_secret=guess, spawn_token_env=VAR)
            request = pb.AcquireRequest(session_id=sid, host_id="host-a", operation_id=secrets.token_hex(16),
                                        live_on_commit=True, gate=gate)
            assert refused(cluster, request) == "ATTESTATION_FAILED"
            assert Path(f"/proc/{outer}/cgroup").read_text() == before, "a refused gate was moved"
        with pytest.raises(grpc.RpcError) as missing:
            cluster.stub.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10)
        assert reason_of(missing.value) == "NOT_FOUND"  # type: ignore[arg-type]
        gate = pb.GateSpawn(pid_hint=pid, token_secret=secret, spawn_token_env=VAR)
        granted = cluster.stub.Acquire(pb.AcquireRequest(
            session_id=sid, host_id="host-a", operation_id=secrets.token_hex(16), live_on_commit=True,
            gate=gate), timeout=30)
        assert granted.record.lease.owner.pid == pid and granted.grant.spawn_token == token
        assert Path(f"/proc/{outer}/cgroup").read_text() != before  # now in its session cgroup
    finally:
        victim.kill()
        victim.wait(10)


def test_a_takeover_whose_gate_cannot_be_attested_asks_nothing_of_the_owner(cluster: Cluster) -> None:
    """The takeover's Acquire is what asks the owner to let go, and only after its gate is attested:
    refused there, the owner is not asked, so its `run` keeps its CMD running."""
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-takeover-bad-gate"
    with frozen_owner(cluster, a, sid) as (first, child):
        before = cluster.record(sid)
        gate = pb.GateSpawn(pid_hint=1, token_secret=spawn_tokens.mint_spawn_secret(), spawn_token_env=VAR)
        request = pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id=secrets.token_hex(16),
                                    takeover=True, wait_seconds=5, live_on_commit=True, gate=gate)
        assert refused(cluster, request) == "ATTESTATION_FAILED"
        assert cluster.record(sid) == before, "a refused takeover asked the owner to let go"
        assert not gone(child) and first.proc.poll() is None
    os.kill(first.run_pid, signal.SIGTERM)  # never asked, it would run on: ended here
    assert first.wait(30) == 0, first.err()


def test_a_forced_takeover_whose_gate_cannot_be_attested_kills_nothing_and_writes_nothing(
        cluster: Cluster) -> None:
    a, _ = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-force-bad-gate"
    with frozen_owner(cluster, a, sid) as (first, child):
        operation = secrets.token_hex(16)
        cluster.stub.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=operation,
                                                             host_id="host-b"), timeout=30)
        before = cluster.record(sid)
        # A gate pid carrying no token of this secret: the force is honoured for this operation,
        # and would kill A's tree, but the gate is attested first.
        gate = pb.GateSpawn(pid_hint=1, token_secret=spawn_tokens.mint_spawn_secret(), spawn_token_env=VAR)
        request = pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id=operation, takeover=True,
                                    force=True, live_on_commit=True, gate=gate)
        assert refused(cluster, request) == "ATTESTATION_FAILED"
        assert not gone(child), "a refused force killed the owner"
        assert cluster.record(sid) == before, "a refused force wrote something"
    first.wait(30)  # A's run wakes to the handoff request standing, and ends its tree


def test_a_takeover_replaying_an_earlier_runs_grant_releases_it_and_is_granted_afresh(
        cluster: Cluster, tmp_path: Path) -> None:
    """A takeover keeps its operation id until granted, so a `run` that died right after its grant
    leaves the id for the next one, whose Acquire then replays that grant: committed to the dead
    run's gate, not to the new one. The new run never releases its own gate under it: while the old
    gate lives it says so and changes nothing; once it is gone, it releases that grant and asks again
    under the same operation, granted afresh."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-replayed-grant"
    first = cluster.run(a, sid, cmd=["true"])
    assert first.wait(30) == 0, first.err()  # a record, released
    state = tmp_path / "state"
    operation = secrets.token_hex(16)
    (state / "holdfast" / "takeovers").mkdir(parents=True, mode=0o700)
    (state / "holdfast" / "takeovers" / f"host-b.{sid}").write_text(operation)
    # The earlier run: its gate committed by its grant under that operation id, then gone with it.
    secret = spawn_tokens.mint_spawn_secret()
    earlier = b.spawn(["sleep", "600"], env={**os.environ, VAR: spawn_tokens.spawn_token_for(secret)})
    gate = pb.GateSpawn(pid_hint=b.host_pid(earlier), token_secret=secret, spawn_token_env=VAR)
    granted = cluster.stub.Acquire(pb.AcquireRequest(
        session_id=sid, host_id="host-b", operation_id=operation, takeover=True, live_on_commit=True,
        gate=gate), timeout=30)
    assert granted.record.lease.owner.spawn_token == spawn_tokens.spawn_token_for(secret)
    marker = tmp_path / "ran"
    kept = {"XDG_STATE_HOME": str(state)}
    # While the earlier run's gate lives it holds fence 2: nothing is released, nothing runs.
    held = cluster.run(b, sid, "--takeover", cmd=["touch", str(marker)], env=kept)
    assert held.wait(60) != 0 and "still runs; end it, or remove" in held.err(), held.err()
    assert not marker.exists() and cluster.record(sid).record.lease.claim_status == pb.LIVE
    os.kill(b.outer_pid(earlier), signal.SIGKILL)  # the gate itself, not the nsenter around it
    earlier.wait(10)
    replayed = cluster.run(b, sid, "--takeover", cmd=["touch", str(marker)], env=kept)
    assert replayed.wait(60) == 0, replayed.err()
    assert "granted at fence 2 to an earlier `run`" in replayed.err()
    assert marker.exists()
    found = cluster.record(sid)
    assert found.record.lease.fence == 3 and found.record.lease.owner.spawn_token != granted.grant.spawn_token
    # The earlier grant released once its gate was proven gone, then this run's, which ran and ended.
    # Its own operation's grant was replayed before anything was asked of that owner: no request.
    assert [h.transition for h in found.history][-4:] == ["grant", "release", "grant", "release"]
