"""The spawn gate and the client's tree ending, with real processes (no coordinator needed)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from holdfast.agent import observe
from holdfast.coordinator.gate import Gate
from holdfast.coordinator.tree import SessionCgroup, Tree, end_tree
from holdfast.v1 import agent_pb2

pytestmark = [pytest.mark.timeout(60)]
VAR = "HOLDFAST_SPAWN_TOKEN"


def ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def exited_within(pid: int, seconds: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def test_cmd_runs_only_after_committed_in_the_same_process(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    token = secrets.token_hex(16)
    gate = Gate(["sh", "-c", f'echo "$$ ${VAR}" > {marker}; exec sleep 30'], {**os.environ, VAR: token})
    try:
        time.sleep(0.3)
        # Blocked, not running CMD, and carrying the token from its first instruction on.
        assert not marker.exists()
        assert f"{VAR}={token}".encode() in Path(f"/proc/{gate.pid}/environ").read_bytes()
        before = ticks(gate.pid)
        gate.release()
        deadline = time.monotonic() + 10
        while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid, seen = marker.read_text().split()
        # exec keeps pid and start ticks: what the agent attested is what runs CMD.
        assert int(pid) == gate.pid and ticks(gate.pid) == before and seen == token
    finally:
        gate.process.kill()
        gate.process.wait()


def test_abort_and_a_stray_line_never_run_cmd(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    aborted = Gate(["touch", str(marker)], dict(os.environ))
    aborted.abort()
    assert aborted.process.wait(10) != 0
    stray = Gate(["touch", str(marker)], dict(os.environ))
    os.write(stray._write_fd, b"commit\n")  # not the exact word
    stray.abort()
    assert stray.process.wait(10) != 0
    assert not marker.exists()


PARENT = """
import json, os, sys, time
from holdfast.agent import observe
from holdfast.coordinator.gate import Gate
gate = Gate(["touch", sys.argv[1]], dict(os.environ))
print(json.dumps({"gate": gate.pid}), flush=True)
time.sleep(300)
"""


def test_a_dead_parent_means_cmd_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(marker)], stdout=subprocess.PIPE)
    try:
        gate_pid = json.loads(parent.stdout.readline())["gate"]  # type: ignore[union-attr]
        fd = os.pidfd_open(gate_pid)
        assert not select.select([fd], [], [], 0.3)[0]  # blocked while its parent lives
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # The parent's death closed the only write end: the gate ends without running CMD.
        assert select.select([fd], [], [], 10)[0]
        os.close(fd)
        assert not marker.exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# A tree: the root traps SIGTERM (exits 7 on it); a child ignores SIGTERM and keeps the token; a
# second child drops the token from its environment (only a cgroup can find it).
TREE = f"""
trap 'exit 7' TERM
sh -c 'trap "" TERM; while :; do sleep 1; done' &
echo $! > {{pids}}
env -u {VAR} sh -c 'trap "" TERM; while :; do sleep 1; done' &
echo $! >> {{pids}}
while :; do sleep 1; done
"""


def spawn_tree(tmp_path: Path, cgroup: SessionCgroup | None) -> tuple[Gate, Tree, list[int]]:
    token = secrets.token_hex(16)
    pids = tmp_path / "pids"
    gate = Gate(["sh", "-c", TREE.format(pids=pids)], {**os.environ, VAR: token}, process_group=0)
    if cgroup is not None:
        cgroup.add(gate.pid)
    gate.release()
    deadline = time.monotonic() + 10
    while len(pids.read_text().split() if pids.exists() else []) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return gate, Tree(VAR, token, cgroup), [int(p) for p in pids.read_text().split()]


def writable_cgroup() -> bool:
    probe = SessionCgroup.create("gate-test-probe", 1)
    if probe is None:
        return False
    probe.remove()
    return True


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not writable_cgroup(), reason="needs a writable cgroup v2 (root)")
def test_end_tree_with_a_cgroup_sigterm_grace_then_cgroup_kill(tmp_path: Path) -> None:
    cgroup = SessionCgroup.create(f"gate-test-{secrets.token_hex(4)}", 1)
    assert cgroup is not None
    gate, tree, (keeps_token, dropped_token) = spawn_tree(tmp_path, cgroup)
    try:
        assert {gate.pid, keeps_token, dropped_token} <= tree.members()
        started = time.monotonic()
        assert end_tree(tree, grace=0.5)
        assert time.monotonic() - started >= 0.5  # the survivors were given the grace period
        assert gate.process.wait(5) == 7           # the root took SIGTERM gracefully
        assert exited_within(keeps_token, 0) and exited_within(dropped_token, 0)
        assert not cgroup.populated() and tree.gone()
    finally:
        cgroup.kill()
        gate.process.wait(5)
        cgroup.remove()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not writable_cgroup(), reason="needs a writable cgroup v2 (root)")
def test_a_new_cgroup_sweeps_only_empty_cgroups_of_earlier_fences() -> None:
    session = f"sweep-test-{secrets.token_hex(4)}"
    later, crashed, busy = (SessionCgroup.create(session, f) for f in (5, 1, 1))
    assert crashed and busy and later and len({crashed.path, busy.path, later.path}) == 3
    swept_ref = agent_pb2.CgroupRef(path=crashed.path, inode=crashed.inode)
    sleeper = subprocess.Popen(["sleep", "60"])
    ours = None
    try:
        busy.add(sleeper.pid)
        ours = SessionCgroup.create(session, 2)  # a crashed fence-1 run left `crashed` behind
        assert ours is not None
        assert not os.path.exists(crashed.path), "an empty cgroup of an earlier fence is swept"
        assert os.path.exists(busy.path), "a populated one is never touched: its tree is still ending"
        assert os.path.exists(later.path), "a later fence's cgroup is not ours to judge"
        # The agent's tree proof: a swept cgroup was empty (rmdir proves it), a busy one is not,
        # and without the holdfast/ hierarchy in view nothing is known.
        assert observe.cgroup_populated(swept_ref) is False
        assert observe.cgroup_populated(agent_pb2.CgroupRef(path=busy.path, inode=busy.inode)) is True
        unmounted = agent_pb2.CgroupRef(path=f"/nonexistent-{session}/holdfast/x", inode=swept_ref.inode)
        assert observe.cgroup_populated(unmounted) is None
    finally:
        busy.kill()
        sleeper.wait(5)
        for cgroup in (busy, later, ours):
            if cgroup is not None:
                cgroup.remove()


def test_end_tree_without_a_cgroup_finds_the_token_carriers(tmp_path: Path) -> None:
    gate, tree, (keeps_token, dropped_token) = spawn_tree(tmp_path, None)
    try:
        assert end_tree(tree, grace=0.3)
        assert gate.process.wait(5) == 7
        assert exited_within(keeps_token, 0)
        # The stated limit without a cgroup: a process that dropped the token is not found.
        assert not exited_within(dropped_token, 0)
    finally:
        for pid in (keeps_token, dropped_token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gate.process.wait(5)


def test_end_tree_never_signals_a_process_that_is_not_a_member() -> None:
    stranger = subprocess.Popen(["sleep", "30"], env={**os.environ, VAR: secrets.token_hex(16)})
    try:
        tree = Tree(VAR, secrets.token_hex(16), None)
        assert tree.signal(signal.SIGKILL) == 0
        assert end_tree(tree, grace=0.1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
