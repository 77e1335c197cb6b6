"""Hostile trees against the single-writer promise, with real agents, a real coordinator and etcd,
and `holdfast run` started by root and by an unprivileged user.

Each of these broke the promise once: a fork-hopping tree was declared gone by a one-pass scan
(granted at fence 2 while the fence-1 tree kept writing); a tree that drops its token or leaves
its session with setsid is found only by its cgroup, which unprivileged runs had none of; an agent
restarted with another token variable called a live tree gone. The oracle is independent of the
code under test: each tree holds an flock while any of its processes lives.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.conftest import AgentProcess, attest, mint_token, probe, stub_for
from tests.integration.hostile_trees import HostileTree
from tests.integration.run_fixtures import Cluster

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]
VAR = "HOLDFAST_SPAWN_TOKEN"
P = agent_pb2.ProbeOutcome
LIVE_PROBES = 15


@pytest.fixture
def shared() -> Iterator[Path]:
    path = unprivileged.shared_dir("holdfast-hostile-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


CROWD = "for i in $(seq 150); do sleep 600 & done; echo up > \"$0\"; wait"


def start_tree(tree: HostileTree, token: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(tree.argv, env={**os.environ, **tree.env, VAR: token})
    tree.wait_up()
    return proc


def test_the_agent_never_reports_a_fork_hopping_tree_gone(shared: Path, simhosts) -> None:  # type: ignore[no-untyped-def]
    # A host of its own (a PID namespace with its agent): the tree and 150 unrelated processes are
    # all that is on it, as on a node, and no other test run's trees churn its process table.
    host = simhosts("host-hopper")
    agent = stub_for(host.agent_address)
    crowd_up = shared / "crowd-up"
    os.mkfifo(crowd_up)
    host.spawn(["sh", "-c", CROWD, str(crowd_up)])
    with open(crowd_up) as f:
        assert f.read().strip() == "up"
    tree = HostileTree(shared, "hopper")
    token = mint_token()
    root = host.spawn(tree.argv, env={**os.environ, **tree.env, VAR: token})
    tree.wait_up()
    # Attested without a session, so no cgroup: the scan alone must prove (or not) the tree gone.
    # The hint: the root as the host numbers it (the hopping branch's orphans are roots too).
    identity = attest(agent, token, host.host_pid(root))
    tree.end_root()  # the root is gone; only the hopping branch carries the token, never staying put
    root.wait(10)
    try:
        called_gone = 0
        # Each probe's scan runs up to 256 passes (1 s) while the hopper lives: 15 probes try more
        # passes than the 60 one-to-eight-pass probes that first showed the hole (198 of 200).
        for _ in range(LIVE_PROBES):
            result = probe(agent, identity, check_tree=True)
            # The root is proven dead: its pid absent, or already reused by another process (the
            # hopper burns pids), whose pidfs inode differs.
            assert result.outcome in (P.PID_ABSENT, P.IDENTITY_MISMATCH), result
            called_gone += result.tree_gone
        assert tree.alive()
        assert called_gone == 0, f"{called_gone} of {LIVE_PROBES} probes called a live hopping tree gone"
        tree.end()
        gone = probe(agent, identity, check_tree=True)
        assert gone.tree_gone, "once the tree is gone a stable scan says so: " + gone.tree_reason
    finally:
        tree.end()


def test_an_agent_restarted_with_another_token_variable_proves_nothing(shared: Path) -> None:
    token = mint_token()
    first = AgentProcess(shared, "host-var", env_var=VAR)
    child = subprocess.Popen(["sleep", "600"], env={**os.environ, VAR: token})
    try:
        identity = attest(first.stub, token, child.pid)
        assert identity.spawn_token_env == VAR, "the attested identity names its variable"
        first.stop()
        second = AgentProcess(shared, "host-var", env_var="ORCA_AGENT_SESSION_SPAWN_TOKEN")
        try:
            alive = probe(second.stub, identity, check_tree=True)
            assert alive.outcome == P.INDETERMINATE and VAR in alive.reason
            child.kill()
            child.wait()
            # Even a root proven absent: its tree was looked for under the wrong name.
            dead = probe(second.stub, identity, check_tree=True)
            assert dead.outcome == P.INDETERMINATE and not dead.tree_gone
        finally:
            second.stop()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("kind", "as_nobody"), [("hopper", True), ("hopper", False), ("dropper", True),
                                                 ("setsid", True)])
def test_a_hostile_tree_keeps_its_session_until_it_is_really_gone(cluster: Cluster, shared: Path,
                                                                   kind: str, as_nobody: bool) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = f"hostile-{kind}-{secrets.token_hex(4)}"
    tree = HostileTree(shared, kind)
    owner = cluster.run(a, sid, "--grace", "0.5", cmd=tree.argv, as_nobody=as_nobody, env=tree.env)
    tree.wait_up()
    record = cluster.record(sid).record
    assert record.lease.fence == 1
    assert record.lease.owner.cgroup.path, "the agent made the tree a session cgroup, whoever ran it"
    marker = shared / "second-ran"
    # The second writer checks the tree's lock itself: an overlap is logged, not inferred.
    second_cmd = ["sh", "-c", f'flock -n "$LOCK" true || echo overlap >> "$LOG"; touch {marker}']
    plain = cluster.run(b, sid, cmd=second_cmd, env=tree.env)
    waited = cluster.run(b, sid, "--wait", "2", cmd=second_cmd, env=tree.env)
    assert plain.wait(60) == 75 and waited.wait(60) == 75, plain.err() + waited.err()
    assert not marker.exists() and tree.alive()
    assert cluster.record(sid).record.lease.fence == 1, "a refusal wrote nothing"
    # A takeover: the owner's run ends the tree (it ignores SIGTERM, hops, hides) and releases only
    # once the tree is proven gone; only then may the second CMD run.
    taker = cluster.run(b, sid, "--takeover", "--handoff-timeout", "60", cmd=second_cmd, env=tree.env)
    assert taker.wait(90) == 0, taker.err() + owner.err()
    owner.wait(30)
    assert marker.exists() and tree.overlaps() == 0
    assert not tree.alive(), "the old tree lived on after its session was handed over"
    assert cluster.record(sid).record.lease.fence == 2


@pytest.mark.parametrize("kind", ["hopper", "dropper"])
def test_a_tree_whose_run_and_root_died_is_not_granted_away(cluster: Cluster, shared: Path,
                                                            kind: str) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = f"hostile-crash-{secrets.token_hex(4)}"
    tree = HostileTree(shared, kind)
    owner = cluster.run(a, sid, cmd=tree.argv, as_nobody=True, env=tree.env)
    tree.wait_up()
    os.kill(owner.run_pid, 9)  # the owner's `run` dies ...
    owner.wait(30)
    tree.end_root()  # ... and so does the tree's root: its pid is absent, the rest lives on
    marker = shared / "second-ran"
    try:
        waited = cluster.run(b, sid, "--wait", "3", cmd=["touch", str(marker)])
        assert waited.wait(60) == 75, waited.err()
        assert "cgroup is still populated" in waited.err()
        # A tree seen running is held, not unknown: no hint to `recover` it into a second writer.
        assert "TREE_ALIVE" in waited.err() and "recover" not in waited.err(), waited.err()
        assert not marker.exists() and tree.alive()
        lease = cluster.record(sid).record.lease
        assert lease.fence == 1 and lease.claim_status == pb.LIVE  # a refusal wrote nothing
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            tree.end()


def test_a_carrier_an_older_process_starts_for_the_tree_keeps_its_session(cluster: Cluster,
                                                                          shared: Path) -> None:
    """A tree scan reads no environ of a process older than the tree's root (proc/scan.py). A
    process that an older one starts *for* the tree — outside its cgroup, like a `systemd-run
    --user` — is younger than the root, is read, and keeps the session held once the root is gone."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = f"hostile-recruit-{secrets.token_hex(4)}"
    requests, started, go = shared / "requests", shared / "started", shared / "go"
    for fifo in (requests, started, go):
        os.mkfifo(fifo, 0o666)
    # Older than the session: starts a carrier of whatever token the tree hands it.
    script = f'read tok < "{requests}"; {VAR}="$tok" sleep 600 & echo up > "{started}"; wait'
    helper = a.spawn(["sh", "-c", script], start_new_session=True)
    try:
        owner = cluster.run(a, sid, cmd=["sh", "-c", f'echo "${VAR}" > "{requests}"; read x < "{go}"'])
        assert started.read_text().strip() == "up"  # blocks until the helper has started the carrier
        os.kill(owner.run_pid, 9)  # its `run` dies, so nothing ends the tree but the takeover's proof
        owner.wait(30)
        go.write_text("end\n")     # the tree's root exits: its cgroup is empty, its carrier lives on
        waited = cluster.run(b, sid, "--wait", "3", cmd=["true"])
        assert waited.wait(60) == 75, waited.err()
        assert "carry the token" in waited.err()
        lease = cluster.record(sid).record.lease
        assert lease.fence == 1 and lease.claim_status == pb.LIVE  # a refusal wrote nothing
    finally:
        os.killpg(helper.pid, 9)
        helper.wait(10)
