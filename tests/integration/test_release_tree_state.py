"""A Release is refused TREE_ALIVE only when the owner's host saw its tree alive, and
OWNERSHIP_UNKNOWN when it could not prove the tree gone (agent/probe_rules.py `tree_verdict`,
coordinator/adjudication.py `release_refusal`): `holdfast run`, whose own check found its tree
gone, asks an unproven release again until the agent can prove it, and exits 0 with the session
released instead of 75 with it held; a refusal writes nothing either way.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.client.owner import RELEASE_RETRY_S
from holdfast.common.reasons import reason_of
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.run_fixtures import Cluster, until
from tests.integration.stuck_fuse import StuckFuse
from tests.integration.test_agent_stuck_environ import unreadable

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]
PYTHON = "/usr/bin/python3"
# An owner root: forks a child that keeps the token and the session cgroup (it waits on its stdin,
# which it shares with the root), says the child's pid, and exits.
FORKS_AND_EXITS = r"""
import os, sys
os.read(0, 1)
child = os.fork()
if child == 0:
    sys.stdout.close()
    os.read(0, 1)
    os._exit(0)
print(child, flush=True)
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    path = unprivileged.shared_dir("holdfast-release-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def refusal(call, request) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=30)
    return reason_of(refused.value), refused.value.details() or ""  # type: ignore[arg-type]


def test_an_unproven_tree_is_asked_again_by_run_and_released_once_provable(cluster: Cluster,
                                                                         shared: Path) -> None:
    """A root process younger than the gate, whose memory nobody can read (tests/integration/
    stuck_fuse.py), leaves the tree's absence unproven for the agent (root, it reads every environ):
    the gate's proof needs the scan (no no-new-privileges: CGROUP_AND_SCAN). The run, nobody, is
    refused that environ at once and finds its own tree gone."""
    sid = f"unproven-{secrets.token_hex(4)}"
    ready, end = shared / "ready", shared / "end"
    for fifo in (ready, end):
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)
    mountpoint = shared / "fuse"
    mountpoint.mkdir()
    hostile: subprocess.Popen[bytes] | None = None
    with StuckFuse(mountpoint) as fuse:
        a = cluster.host("host-a")  # after the mount: the host's mount namespace has it
        owner = cluster.run(a, sid, cmd=["sh", "-c", 'echo r > "$0" && read x < "$1"', str(ready), str(end)],
                            as_nobody=True)
        assert ready.read_text() == "r\n", owner.err()
        # An environ of its own (an empty one is read without touching its memory), no token.
        plain = {"PATH": os.environ["PATH"]}
        hostile = unreadable(fuse, lambda argv, fds: a.spawn(argv, env=plain, pass_fds=fds), PYTHON,
                             a.outer_pid)
        before = cluster.record(sid)
        proof = before.record.lease.owner
        assert proof.tree_proof == agent_pb2.CGROUP_AND_SCAN, proof.tree_proof_reason
        end.write_text("end\n")  # CMD ends: its tree is gone, but the agent cannot prove it
        said = "release refused (OWNERSHIP_UNKNOWN): "
        until("run's release refused as unproven", lambda: said in owner.err())
        line = next(line for line in owner.err().splitlines() if said in line)
        assert "not proven gone: 1 process(es) could not be read" in line, line
        assert "asking again" in line and owner.proc.poll() is None, owner.err()
        after = cluster.record(sid)  # each refusal wrote nothing
        assert (after.record, list(after.history)) == (before.record, list(before.history))
    # The daemon gone, the hostile process's read returns and it ends: the agent proves the tree
    # gone, and the run's next try releases.
    hostile.wait(30)
    assert owner.wait(60) == 0, owner.err()
    assert f"session {sid} released at fence 1" in owner.err(), owner.err()
    assert "TREE_ALIVE" not in owner.err()
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED


def test_run_says_a_tree_seen_alive_at_once(cluster: Cluster, shared: Path) -> None:
    """A root process carrying the session's token, started beside the tree: the run (nobody) may not
    read it and finds its own tree gone, the agent reads it and sees the tree alive. Asking again
    would only repeat that for RELEASE_RETRY_S: run exits 75 at the first TREE_ALIVE."""
    sid = f"alive-run-{secrets.token_hex(4)}"
    ready, end = shared / "ready", shared / "end"
    for fifo in (ready, end):
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)
    a = cluster.host("host-a")
    owner = cluster.run(a, sid, cmd=["sh", "-c", 'echo r > "$0" && read x < "$1"', str(ready), str(end)],
                        as_nobody=True)
    assert ready.read_text() == "r\n", owner.err()
    lease = cluster.record(sid).record.lease
    carrier = a.spawn(["sleep", "300"], env={lease.owner.spawn_token_env: lease.owner.spawn_token})
    try:
        before = cluster.record(sid)
        end.write_text("end\n")
        assert owner.wait(RELEASE_RETRY_S - 10) == 75, owner.err()
        assert "TREE_ALIVE" in owner.err() and "still carry the token" in owner.err(), owner.err()
        assert "asking again" not in owner.err()
        after = cluster.record(sid)
        assert (after.record, list(after.history)) == (before.record, list(before.history))
    finally:
        os.kill(a.outer_pid(carrier), signal.SIGKILL)
        carrier.wait(10)


@pytest.mark.skipif(not cgroups.capability().able, reason="needs cgroup v2 in the node's namespace")
def test_a_child_left_in_the_session_cgroup_is_tree_alive(cluster: Cluster) -> None:
    sid = f"alive-{secrets.token_hex(4)}"
    a = cluster.host("host-a")
    coord = cluster.stub
    grant = coord.Acquire(pb.AcquireRequest(session_id=sid, host_id=a.host_id, live_on_commit=True,
                                            operation_id=secrets.token_hex(16)), timeout=30).grant
    root = a.spawn([PYTHON, "-c", FORKS_AND_EXITS], env={grant.spawn_token_env: grant.spawn_token},
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert root.stdin is not None and root.stdout is not None
    try:
        commit = pb.CommitOwnerRequest(session_id=sid, fence=grant.fence, secret=grant.secret,
                                       pid_hint=a.host_pid(root))
        committed = coord.CommitOwner(commit, timeout=30).record
        assert committed.lease.owner.cgroup.path, committed.lease.owner.tree_proof_reason
        root.stdin.write(b"g")  # forked in the session cgroup, with the token
        root.stdin.flush()
        assert int(root.stdout.readline()) > 0
        assert root.wait(10) == 0
        before = cluster.record(sid)
        release = pb.ReleaseRequest(session_id=sid, fence=grant.fence, secret=grant.secret)
        reason, message = refusal(coord.Release, release)
        assert reason == "TREE_ALIVE", message
        assert "cgroup is still populated" in message and "root " in message, message
        after = cluster.record(sid)
        assert (after.record, list(after.history)) == (before.record, list(before.history))
    finally:
        root.stdin.close()  # the child reads its end and exits
    # Once the child is gone its host proves it: asked until then (the cgroup empties as it exits).
    until("the release of the ended tree", lambda: released(coord, release))
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED


def released(coord, release: pb.ReleaseRequest) -> bool:  # type: ignore[no-untyped-def]
    try:
        coord.Release(release, timeout=30)
    except grpc.RpcError as exc:
        reason = reason_of(exc)  # type: ignore[arg-type]
        assert reason in ("TREE_ALIVE", "OWNERSHIP_UNKNOWN"), exc
        return False
    return True
