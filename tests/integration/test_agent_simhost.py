"""Agents in simulated hosts (own PID namespaces): invisibility across hosts, the incarnation
rule both ways, real PID reuse via ns_last_pid (also inside one clock tick), and KillOwner."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import agent_pb2
from tests.integration.conftest import attest, descendants, mint_token, probe, stub_for, wait_carrier

P = agent_pb2.ProbeOutcome
VAR = "HOLDFAST_SPAWN_TOKEN"
REBOOT_TRIES, REBOOT_BUDGET_S = 40, 60.0

# Runs inside the namespace: make the next fork get pid TARGET, exec sleep with TOKEN there.
REUSE = """
import json, os, sys
target, token = int(sys.argv[1]), sys.argv[2]
for _ in range(50):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(target - 1))
    pid = os.fork()
    if pid == 0:
        os.execve("/bin/sleep", ["sleep", "300"], {"HOLDFAST_SPAWN_TOKEN": token})
    if pid == target:
        print(json.dumps({"pid": pid}), flush=True)
        os.waitpid(pid, 0)
        sys.exit(0)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
sys.exit("could not land on the target pid")
"""

# Inside one clock tick: fork A, take its kernel identity, kill it, and fork B on the same pid,
# until B's start ticks equal A's. Prints A's identity facts; B keeps running.
SAME_TICK = """
import json, os, sys
def ticks(pid):
    line = open(f"/proc/{pid}/stat", "rb").read()
    return int(line[line.rfind(b")") + 2:].split()[19])
def child(token):
    pid = os.fork()
    if pid == 0:
        os.execve("/bin/sleep", ["sleep", "300"], {"HOLDFAST_SPAWN_TOKEN": token})
    return pid
for _ in range(500):
    a = child(sys.argv[1])
    fd = os.pidfd_open(a)
    a_ino, a_ticks = os.fstat(fd).st_ino, ticks(a)
    os.kill(a, 9)
    os.waitpid(a, 0)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(a - 1))
    b = child(sys.argv[2])
    if b == a and ticks(b) == a_ticks:
        print(json.dumps({"pid": a, "start_ticks": a_ticks, "pidfd_ino": a_ino,
                          "b_ino": os.fstat(os.pidfd_open(b)).st_ino}), flush=True)
        os.waitpid(b, 0)
        sys.exit(0)
    os.kill(b, 9)
    os.waitpid(b, 0)
sys.exit("no same-tick reuse in 500 tries")
"""


def host_stub(host):
    return stub_for(host.agent_address)


def test_processes_of_one_host_are_invisible_to_another(simhosts, children) -> None:
    a, b = simhosts("sim-a"), simhosts("sim-b")
    token = mint_token()
    children.append(b.spawn(["sleep", "300"], env={VAR: token, "PATH": "/usr/bin:/bin"}))
    scan_b = wait_carrier(host_stub(b), token)
    assert scan_b.complete and [c.pid for c in scan_b.carriers] == [b.host_pid(children[0])]
    scan_a = host_stub(a).ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
    assert scan_a.enumerable and scan_a.complete and not scan_a.carriers
    with pytest.raises(grpc.RpcError) as err:
        attest(host_stub(a), token)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # An identity recorded on B, sent to A under A's host id, names another namespace: unknown.
    foreign = attest(host_stub(b), token)
    foreign.host_id = "sim-a"
    result = probe(host_stub(a), foreign)
    assert result.outcome == P.INDETERMINATE and "namespace" in result.reason


def test_reboot_is_a_new_incarnation_and_the_rule_holds_both_ways(simhosts, children) -> None:
    host = simhosts("sim-reboot")
    reused = 0
    # The kernel picks the new inode (the lowest free one); another suite on the machine making
    # namespaces takes freed numbers too, so reboot until a reuse is seen, bounded in count and time.
    deadline = time.monotonic() + REBOOT_BUDGET_S
    for _ in range(REBOOT_TRIES):
        token = mint_token()
        children.append(host.spawn(["sleep", "300"], env={VAR: token}))
        wait_carrier(host_stub(host), token)
        old = attest(host_stub(host), token)
        host.reboot()
        info = host_stub(host).GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
        assert info.incarnation != old.incarnation
        assert info.incarnation.boot_id == old.incarnation.boot_id
        result = probe(host_stub(host), old)
        assert result.answered_by_incarnation == info.incarnation
        if info.incarnation.pid_ns == old.incarnation.pid_ns:
            # Same nsfs inode, PID 1 started at other ticks: the old namespace and all in it are gone.
            assert (result.outcome, result.mismatch_field) == (P.IDENTITY_MISMATCH, "incarnation")
            reused += 1
        else:
            # Another inode: the old namespace may still exist somewhere.
            assert result.outcome == P.INDETERMINATE and "namespace" in result.reason
        if reused or time.monotonic() > deadline:
            break
    assert reused, f"no reboot reused the namespace inode in {REBOOT_TRIES} tries or {REBOOT_BUDGET_S:g} s"
    # The other way, deterministically: a live namespace's identity judged by this host's agent.
    elsewhere = simhosts("sim-reboot-b")
    token = mint_token()
    children.append(elsewhere.spawn(["sleep", "300"], env={VAR: token}))
    wait_carrier(host_stub(elsewhere), token)
    foreign = attest(host_stub(elsewhere), token)
    foreign.host_id = "sim-reboot"
    assert probe(host_stub(host), foreign).outcome == P.INDETERMINATE


def test_pid_reuse_is_identity_mismatch(simhosts, children) -> None:
    host = simhosts("sim-reuse")
    stub = host_stub(host)
    token = mint_token()
    owner = host.spawn(["sleep", "300"], env={VAR: token})
    children.append(owner)
    wait_carrier(stub, token)
    identity = attest(stub, token)
    unwatched = agent_pb2.ProcessIdentity()
    unwatched.CopyFrom(identity)
    unwatched.pidfd_ino = 0  # another identity for the same pid: the exit memory must not cover it
    stream = stub.WatchExits(agent_pb2.WatchExitsRequest(owners=[identity]), timeout=10)
    # Killed only once the agent says its pidfd watch is armed: killed first, the owner would be
    # answered pid-absent and no exit remembered (seen once in CI on a loaded machine).
    assert next(stream).armed
    os.kill(host.outer_pid(owner), signal.SIGKILL)
    event = next(stream)
    assert event.result.outcome == P.EXIT_OBSERVED
    owner.wait(5)
    new_token = mint_token()
    reuse = host.spawn([sys.executable, "-c", REUSE, str(identity.pid), new_token], stdout=subprocess.PIPE)
    children.append(reuse)
    assert json.loads(reuse.stdout.readline())["pid"] == identity.pid
    wait_carrier(stub, new_token)
    # The watched identity's exit is remembered, even with its pid now taken by another process.
    assert probe(stub, identity).outcome == P.EXIT_OBSERVED
    result = probe(stub, unwatched)
    assert (result.outcome, result.mismatch_field) == (P.IDENTITY_MISMATCH, "start-time")
    # The memory is keyed by identity, not pid: the newcomer on that pid is alive.
    newcomer = attest(stub, new_token)
    assert newcomer.pid == identity.pid and newcomer.pidfd_ino != identity.pidfd_ino
    assert probe(stub, newcomer).outcome == P.IDENTITY_MATCHED
    # Without the exit memory, the pidfs inode alone proves the owner gone.
    fresh = probe(stub, agent_pb2.ProcessIdentity(
        host_id=identity.host_id, incarnation=identity.incarnation, pid=identity.pid,
        start_ticks=identity.start_ticks, pidfd_ino=identity.pidfd_ino))
    assert (fresh.outcome, fresh.mismatch_field) == (P.IDENTITY_MISMATCH, "pidfd")


def test_pid_reused_in_the_same_tick_is_caught_by_pidfs_or_token(simhosts, children) -> None:
    host = simhosts("sim-tick")
    stub = host_stub(host)
    info = stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
    token_a, token_b = mint_token(), mint_token()
    helper = host.spawn([sys.executable, "-c", SAME_TICK, token_a, token_b], stdout=subprocess.PIPE)
    children.append(helper)
    facts = json.loads(helper.stdout.readline())
    wait_carrier(stub, token_b)
    assert facts["b_ino"] != facts["pidfd_ino"]
    a = agent_pb2.ProcessIdentity(host_id="sim-tick", incarnation=info.incarnation, pid=facts["pid"],
                                  start_ticks=facts["start_ticks"], pidfd_ino=facts["pidfd_ino"],
                                  spawn_token=token_a, spawn_token_env=VAR)
    by_pidfs = probe(stub, a)
    assert (by_pidfs.outcome, by_pidfs.mismatch_field) == (P.IDENTITY_MISMATCH, "pidfd")
    # Without pidfs the start ticks coincide; the missing token keeps it from counting as alive.
    a.pidfd_ino = 0
    by_token = probe(stub, a)
    assert by_token.outcome == P.INDETERMINATE and "token" in by_token.reason
    # Start ticks alone would have said "the same process": the hazard this test measures.
    a.spawn_token = ""
    assert probe(stub, a).outcome == P.IDENTITY_MATCHED


def test_kill_owner_ends_the_whole_tree(simhosts, children) -> None:
    host = simhosts("sim-kill")
    stub = host_stub(host)
    token = mint_token()
    tree = host.spawn(["sh", "-c", "sleep 300 & (sleep 300 & wait) & wait"],
                      env={VAR: token, "PATH": "/usr/bin:/bin"})
    children.append(tree)
    scan = wait_carrier(stub, token, want=4)
    assert len(scan.carriers) == 4 and sum(c.root for c in scan.carriers) == 1
    identity = attest(stub, token)
    roots = stub.ListTokenRoots(agent_pb2.ListTokenRootsRequest(), timeout=5)
    listed = [(r.identity.pid, r.identity.start_ticks, r.identity.spawn_token) for r in roots.roots]
    assert roots.complete and listed == [(identity.pid, identity.start_ticks, token)]
    before = probe(stub, identity, check_tree=True)
    assert before.outcome == P.IDENTITY_MATCHED and not before.tree_gone
    killed = stub.KillOwner(agent_pb2.KillOwnerRequest(owner=identity, wait_seconds=5), timeout=10)
    assert killed.signalled >= 4
    assert killed.result.outcome in (P.EXIT_OBSERVED, P.PID_ABSENT)
    assert killed.result.tree_checked and killed.result.tree_gone, killed.result.tree_reason
    assert not stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5).carriers


def test_kill_owner_uses_cgroup_kill_and_tree_needs_an_empty_cgroup(simhosts, children) -> None:
    host = simhosts("sim-cgroup")
    stub = host_stub(host)
    info = stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
    assert info.cgroup_writable, "CI hosts have a writable cgroup v2 hierarchy"
    cg = Path(info.cgroup_root) / "holdfast" / f"test-{os.getpid()}-{mint_token()[:8]}"
    try:
        token = mint_token()
        # One descendant drops the token from its environment: only the cgroup still holds it.
        tree = host.spawn(["sh", "-c", f"env -u {VAR} sleep 300 & sleep 300 & wait"],
                          env={VAR: token, "PATH": "/usr/bin:/bin"})
        children.append(tree)
        wait_carrier(stub, token, want=2)
        deadline = time.monotonic() + 5
        while len(descendants(tree.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Made only now, and made again if it went: an empty cgroup under holdfast/ is an earlier
        # version's leftover to any agent, and an agent starting beside this test sweeps it.
        first, *rest = descendants(tree.pid)
        for _ in range(20):
            cg.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (cg / "cgroup.procs").write_text(str(first))
                break
        for pid in rest:  # populated now: no sweep removes it
            (cg / "cgroup.procs").write_text(str(pid))
        # `env -u` drops the token only when it execs sleep; on a loaded machine that comes later.
        deadline = time.monotonic() + 10
        while not (escaped := [p for p in descendants(tree.pid)
                               if VAR.encode() not in Path(f"/proc/{p}/environ").read_bytes()]):
            assert time.monotonic() < deadline, "env -u never exec'd its sleep"
            time.sleep(0.01)
        assert len(escaped) == 1
        identity = attest(stub, token)
        # The agent itself read the root's cgroup (one an earlier version's `run` made): no caller names it.
        assert (identity.cgroup.path, identity.cgroup.inode) == (str(cg), cg.stat().st_ino)
        killed = stub.KillOwner(agent_pb2.KillOwnerRequest(owner=identity, wait_seconds=5), timeout=10)
        assert killed.result.tree_gone and "cgroup is empty" in killed.result.tree_reason
        # The escaped process was ended by cgroup.kill (gone, or a zombie awaiting its reaper).
        stat = Path(f"/proc/{escaped[0]}/stat")
        assert not stat.exists() or b") Z " in stat.read_bytes()
    finally:
        deadline = time.monotonic() + 5
        while cg.exists() and time.monotonic() < deadline:
            try:
                cg.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    (cg / "cgroup.kill").write_text("1")
                time.sleep(0.05)


def test_kill_owner_refuses_a_cgroup_that_is_not_a_session_cgroup(simhosts, children) -> None:
    host = simhosts("sim-cgroup-shared")
    stub = host_stub(host)
    info = stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
    token = mint_token()
    children.append(host.spawn(["sleep", "300"], env={VAR: token, "PATH": "/usr/bin:/bin"}))
    wait_carrier(stub, token, want=1)
    identity = attest(stub, token)
    assert not identity.cgroup.path, "a process outside <root>/holdfast/ gets no cgroup recorded"
    root = Path(info.cgroup_root)
    for shared in (root, root / "holdfast"):
        identity.cgroup.CopyFrom(agent_pb2.CgroupRef(path=str(shared), inode=shared.stat().st_ino
                                                     if shared.exists() else 1))
        with pytest.raises(grpc.RpcError) as refused:
            stub.KillOwner(agent_pb2.KillOwnerRequest(owner=identity, wait_seconds=1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a session cgroup" in refused.value.details()
    assert children[-1].poll() is None, "a refused kill signals nothing"


def test_kill_owner_ends_descendants_that_outlived_their_root(simhosts, children) -> None:
    host = simhosts("sim-orphans")
    stub = host_stub(host)
    token = mint_token()
    tree = host.spawn(["sh", "-c", "sleep 300 & sleep 300 & wait"], env={VAR: token, "PATH": "/usr/bin:/bin"})
    children.append(tree)
    wait_carrier(stub, token, want=3)
    identity = attest(stub, token)
    root = descendants(tree.pid)[0]
    os.kill(root, 9)
    tree.wait(5)
    dead_root = probe(stub, identity, check_tree=True)
    assert dead_root.outcome == P.PID_ABSENT and not dead_root.tree_gone  # orphans still carry it
    assert dead_root.tree_checked and "carry the token" in dead_root.tree_reason
    killed = stub.KillOwner(agent_pb2.KillOwnerRequest(owner=identity, wait_seconds=5), timeout=10)
    assert killed.signalled == 2 and killed.result.tree_gone, killed.result.tree_reason


def test_a_tree_is_read_only_for_roots_not_proven_alive(simhosts, children) -> None:
    """One batch: a live root's tree is not read (it holds its session whatever the tree does); a
    dead root whose orphans run on is judged not gone; a tree wholly gone is judged gone."""
    host = simhosts("sim-batch")
    stub = host_stub(host)
    owners = []
    for shape in ("sleep 300", "sleep 300 & sleep 300 & wait", "sleep 300"):
        token = mint_token()
        tree = host.spawn(["sh", "-c", shape], env={VAR: token, "PATH": "/usr/bin:/bin"})
        children.append(tree)
        wait_carrier(stub, token, want=1 + shape.count("&"))
        owners.append((attest(stub, token), tree))
    (alive, _), (orphaned, orphaned_tree), (ended, ended_tree) = owners
    os.kill(descendants(orphaned_tree.pid)[0], signal.SIGKILL)
    orphaned_tree.wait(5)
    for pid in descendants(ended_tree.pid):
        os.kill(pid, signal.SIGKILL)
    ended_tree.wait(5)
    request = agent_pb2.ProbeOwnersRequest(owners=[alive, orphaned, ended], check_tree=True)
    live, dead_root, gone = stub.ProbeOwners(request, timeout=10).results
    assert live.outcome == P.IDENTITY_MATCHED and not live.tree_checked
    assert dead_root.outcome in (P.PID_ABSENT, P.EXIT_OBSERVED)
    assert dead_root.tree_checked and not dead_root.tree_gone, dead_root.tree_reason
    assert gone.outcome in (P.PID_ABSENT, P.EXIT_OBSERVED)
    assert gone.tree_checked and gone.tree_gone, gone.tree_reason
