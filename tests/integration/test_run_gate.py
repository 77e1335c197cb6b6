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
from types import SimpleNamespace

import pytest

from holdfast.agent.hostinfo import has_pidfs
from holdfast.client.gate import Gate
from holdfast.client.tree import Tree, end_tree
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from tests.integration.conftest import wait_empty

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


def has_exited(pid: int) -> bool:
    """Whether our child `pid` has exited, leaving it unreaped (its status stays for `wait`)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


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
from holdfast.client.gate import Gate
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


# A tree: the root traps SIGTERM (exits 7 on it; `wait` is interrupted by a trapped signal, a
# foreground `sleep` would hold the trap back); a child ignores SIGTERM and keeps the token; a
# second child drops the token from its environment (only a cgroup can find it). Each child
# writes its own pid to a FIFO the root holds open, from the shell that runs it: only then has the
# dropper exec'd without the token (the `$!` of its fork still carries it, in the fork and in
# `env`, until that exec, and a scan then rightly finds it). The test waits on those two lines,
# not on a timer. The dropper also ignores SIGHUP: when the root dies while a member of its process
# group is stopped (end_tree stops the survivors before the kill), the kernel sends the orphaned
# group SIGHUP, which would end the dropper by chance, not by anything end_tree found.
TREE = f"""
trap 'exit 7' TERM
exec 3>{{fifo}}
sh -c 'trap "" TERM; echo "keeps $$" >&3; exec 3>&-; while :; do sleep 1; done' &
env -u {VAR} sh -c 'trap "" TERM HUP; echo "dropped $$" >&3; exec 3>&-; while :; do sleep 1; done' &
exec 3>&-
while :; do sleep 1 & wait $!; done
"""


def spawn_tree(tmp_path: Path, session: str | None) -> tuple[Gate, Tree, list[int]]:
    """The tree behind a gate; with `session`, the gate is moved into a session cgroup the agent's
    own code makes, as AttestSpawn does, before it is released."""
    token = secrets.token_hex(16)
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    gate = Gate(["sh", "-c", TREE.format(fifo=fifo)], {**os.environ, VAR: token}, process_group=0)
    if session is not None:
        made, why = cgroups.make_session_cgroup(gate.pid, session, 1, cgroups.capability())
        assert made is not None, why
    tree = Tree.of_gate(VAR, token, gate.pid)
    gate.release()
    with open(fifo) as f:
        said = dict(f.readline().split() for _ in range(2))
    return gate, tree, [int(said["keeps"]), int(said["dropped"])]


def session_cgroups_here() -> bool:
    return cgroups.capability().able


needs_cgroups = pytest.mark.skipif(os.geteuid() != 0 or not session_cgroups_here(),
                                   reason="needs root and a writable cgroup v2 in this cgroup namespace")


@pytest.mark.root
@needs_cgroups
def test_end_tree_with_a_cgroup_sigterm_grace_then_kill(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    gate, tree, (keeps_token, dropped_token) = spawn_tree(tmp_path, f"gate-test-{secrets.token_hex(4)}")
    # The grace ends on an event, not on the scheduler: end_tree's clock runs real time until the
    # root has exited (seen without reaping it), then jumps past the grace. A root scheduled late
    # under load still runs its TERM trap before the kill; a root never sent SIGTERM is killed at
    # the real end of the grace (-9, not 7).
    grace = 30.0
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + (grace if has_exited(gate.pid) else 0))
    monkeypatch.setattr("holdfast.client.tree.time", clock)
    try:
        assert tree.cgroup and {gate.pid, keeps_token, dropped_token} <= tree.members()
        assert end_tree(tree, grace=grace)
        assert gate.process.wait(5) == 7  # the root took SIGTERM gracefully, within the grace
        assert exited_within(keeps_token, 0) and exited_within(dropped_token, 0)
        assert not tree.populated() and tree.gone()
    finally:
        tree.kill_cgroup()
        gate.process.wait(5)
        cgroups.sweep(cgroups.capability(), grace=0)


@pytest.mark.root
@needs_cgroups
def test_session_cgroups_are_nested_idempotent_and_swept_only_when_empty() -> None:
    cap = cgroups.capability()
    session = f"sweep-test-{secrets.token_hex(4)}"
    sleeper = subprocess.Popen(["sleep", "60"])
    idle = subprocess.Popen(["sleep", "60"])
    try:
        busy, why = cgroups.make_session_cgroup(sleeper.pid, session, 1, cap)
        assert busy is not None, why
        again, _ = cgroups.make_session_cgroup(sleeper.pid, session, 1, cap)
        assert again == busy, "a second attestation of the same gate keeps its cgroup"
        parent = Path(f"/proc/{os.getpid()}/cgroup").read_text().split("0::", 1)[1].strip()
        assert os.path.dirname(busy.path) == os.path.normpath(cap.root + parent), "nested where the gate was"
        empty, _ = cgroups.make_session_cgroup(idle.pid, session, 2, cap)
        assert empty is not None
        idle.kill()
        idle.wait(5)
        wait_empty(Path(empty.path))
        cgroups.sweep(cap)
        assert os.path.exists(empty.path), "one made in the last minute may be an attestation in flight"
        os.utime(empty.path, (time.time() - 2 * cgroups.SWEEP_GRACE_S,) * 2)
        cgroups.sweep(cap)
        assert not os.path.exists(empty.path), "an empty session cgroup is swept"
        assert os.path.exists(busy.path), "a populated one is never removed: its tree is alive"
        # The tree proof: a removed cgroup was empty (rmdir proves it), a busy one is not; read
        # from another cgroup namespace, or made under another mount, nothing is known.
        assert cgroups.populated(empty, cap) is False
        assert cgroups.populated(busy, cap) is True
        elsewhere = agent_pb2.CgroupRef(path=busy.path, inode=busy.inode, cgroup_ns=busy.cgroup_ns + 1)
        assert cgroups.populated(elsewhere, cap) is None
        unmounted = agent_pb2.CgroupRef(path=f"/nonexistent-{session}/x", inode=busy.inode)
        assert cgroups.populated(unmounted, cap) is None
    finally:
        for proc in (sleeper, idle):
            proc.kill()
            proc.wait(5)
        cgroups.sweep(cap, grace=0)


@pytest.mark.root
@needs_cgroups
def test_a_refused_attestations_cgroup_gives_back_what_it_took() -> None:
    """An attestation refused after its move (its gate gone, the pid maybe another process's by
    then) moves what it moved back where it was and removes the cgroup (agent/service.py)."""
    cap = cgroups.capability()
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        where = Path(f"/proc/{stranger.pid}/cgroup").read_text()
        made, why = cgroups.make_session_cgroup(stranger.pid, f"undo-test-{secrets.token_hex(4)}", 1, cap)
        assert made is not None, why
        assert Path(f"/proc/{stranger.pid}/cgroup").read_text() != where
        cgroups.undo(made)
        assert Path(f"/proc/{stranger.pid}/cgroup").read_text() == where
        assert not os.path.exists(made.path)
    finally:
        stranger.kill()
        stranger.wait(5)


@pytest.mark.root
@needs_cgroups
def test_no_session_cgroup_is_nested_in_a_threaded_one() -> None:
    """A threaded cgroup can hold no domain child: a gate found in one is refused its session cgroup,
    saying which cgroup and why, and nothing is made there or moved."""
    cap = cgroups.capability()
    here = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].strip()
    domain = Path(os.path.normpath(cap.root + here)) / f"threaded-test-{secrets.token_hex(4)}"
    threaded = domain / "threads"
    gate = subprocess.Popen(["sleep", "60"])
    try:
        threaded.mkdir(parents=True)
        (threaded / "cgroup.type").write_text("threaded")
        (threaded / "cgroup.procs").write_text(str(gate.pid))
        made, why = cgroups.make_session_cgroup(gate.pid, f"threaded-{secrets.token_hex(4)}", 1, cap)
        assert made is None and f"{threaded} is threaded" in why, why
        assert not [child for child in threaded.iterdir() if child.is_dir()]
        now = Path(f"/proc/{gate.pid}/cgroup").read_text().split("0::", 1)[1].strip()
        assert os.path.normpath(cap.root + now) == str(threaded), "the gate stays where it was"
    finally:
        gate.kill()
        gate.wait(5)
        for made_here in (threaded, domain):
            with contextlib.suppress(OSError):
                made_here.rmdir()


def test_a_gate_knows_its_own_attested_identity_from_another_gates_with_its_token() -> None:
    """Two gates can carry one token (a reservation replayed to two runs); a retried commit then
    finds the session committed to one of them and must tell whether it is its own (client.connection
    `commit`): by the pidfs inode, or without one by pid and start ticks."""
    env = {**os.environ, "HOLDFAST_SPAWN_TOKEN": "shared-" + secrets.token_hex(8)}
    mine, other = Gate(["true"], env), Gate(["true"], env)
    try:
        def identity(gate: Gate, pidfs: bool) -> agent_pb2.ProcessIdentity:
            fd = os.pidfd_open(gate.pid)
            try:
                ino = os.fstat(fd).st_ino if pidfs else 0
            finally:
                os.close(fd)
            ticks = int(Path(f"/proc/{gate.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
            return agent_pb2.ProcessIdentity(pid=gate.pid, start_ticks=ticks, pidfd_ino=ino)

        for pidfs in (True, False) if has_pidfs() else (False,):  # as the agent attests
            assert mine.is_process(identity(mine, pidfs))
            assert not mine.is_process(identity(other, pidfs)), "another gate with the same token"
        moved = identity(mine, False)
        moved.pid += 1  # the agent sees another pid namespace: without an inode nothing is proven
        assert not mine.is_process(moved)
    finally:
        for gate in (mine, other):
            gate.abort()
            gate.process.wait(5)


@pytest.mark.root
@needs_cgroups
def test_a_gate_born_in_another_sessions_cgroup_gets_its_own() -> None:
    """Session `<s>-1`'s cgroup is `holdfast-<s>-1-<fence>-<hex>`, whose name starts as session
    `<s>`'s at fence 1 would. A gate of `<s>` born inside it (a `holdfast run` started from that
    tree) gets a cgroup of its own nested there, and ending it ends nothing of the outer tree;
    likewise for a cgroup of the right name that the agent's user did not make."""
    cap = cgroups.capability()
    session = f"nested-test-{secrets.token_hex(4)}"
    outer_gate = subprocess.Popen(["sleep", "60"])
    inner_gate = subprocess.Popen(["sleep", "60"])
    outer, why = cgroups.make_session_cgroup(outer_gate.pid, f"{session}-1", 3, cap)
    try:
        assert outer is not None, why
        Path(outer.path, "cgroup.procs").write_text(str(inner_gate.pid))  # born in the outer tree
        inner, why = cgroups.make_session_cgroup(inner_gate.pid, session, 1, cap)
        assert inner is not None, why
        assert inner.path != outer.path and os.path.dirname(inner.path) == outer.path
        assert cgroups.kill(inner, cap)
        assert inner_gate.wait(5) == -signal.SIGKILL
        assert outer_gate.poll() is None, "ending the inner session ended the outer session's gate"
        # Named exactly as this session's would be, but not made by the agent's user.
        foreign = Path(outer.path) / f"{cgroups.PREFIX}{session}-2-{secrets.token_hex(4)}"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        Path(foreign, "cgroup.procs").write_text(str(outer_gate.pid))
        own, why = cgroups.make_session_cgroup(outer_gate.pid, session, 2, cap)
        assert own is not None and own.path != str(foreign), why
    finally:
        for proc in (outer_gate, inner_gate):
            proc.kill()
            proc.wait(5)
        if outer is not None:  # every cgroup made here lies below it: removed deepest first
            wait_empty(Path(outer.path))
            for parent, _dirs, _files in os.walk(outer.path, topdown=False):
                os.rmdir(parent)


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
        tree = Tree(VAR, secrets.token_hex(16))
        assert tree.signal(signal.SIGKILL) == set()
        assert end_tree(tree, grace=0.1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_end_tree_bounds_its_scans_as_the_agent_does_by_the_gates_start() -> None:
    """A carrier of the token older than the gate cannot be of its tree (design §2): the client's
    scans skip it as the agent's proof does, so ending the tree neither waits on it nor signals it,
    while a carrier the gate started is ended."""
    token = secrets.token_hex(16)
    older = subprocess.Popen(["sleep", "30"], env={**os.environ, VAR: token})
    try:
        ticks = Tree.of_gate(VAR, token, older.pid).born_since  # the older process's own start
        clock_tick = os.sysconf("SC_CLK_TCK")
        for _ in range(10_000_000):  # a bounded wait on the clock itself: the gate starts a tick later
            if int(time.clock_gettime(time.CLOCK_BOOTTIME) * clock_tick) > ticks:
                break
        gate = Gate(["sleep", "30"], {**os.environ, VAR: token}, process_group=0)
        tree = Tree.of_gate(VAR, token, gate.pid)
        assert tree.born_since > ticks
        assert older.pid not in tree.members() and gate.pid in tree.members()
        gate.release()
        assert end_tree(tree, grace=5)
        assert gate.process.wait(5) != 0 and older.poll() is None
    finally:
        older.kill()
        older.wait()


def test_a_gate_spawned_before_its_grant_runs_cmd_with_the_grants_environment(tmp_path: Path) -> None:
    """A gate spawned before its grant is handed CMD's fence and handle through its memory file at
    release: every value reaches CMD exactly, whatever it holds, and the token stays inherited."""
    token = secrets.token_hex(16)
    handed = {"HOLDFAST_FENCE": "7", "HOLDFAST_PROVIDER": "codex",
              "HOLDFAST_PROVIDER_HANDLE": "it's \"quoted\" $HOME `id` \\ and\na second line"}
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    out = tmp_path / "env.json"
    gate = Gate([sys.executable, "-c", dump, str(out)], {**os.environ, VAR: token, "HOLDFAST_FENCE": ""},
                env_at_release=True)
    gate.release(handed)
    assert gate.process.wait(30) == 0
    seen = json.loads(out.read_text())
    assert {name: seen[name] for name in handed} == handed and seen[VAR] == token


def test_a_gate_whose_environment_cannot_be_handed_never_runs_cmd(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    gate = Gate(["touch", str(marker)], dict(os.environ), env_at_release=True)
    with pytest.raises(ValueError, match="not a shell variable name"):
        gate.release({"HOLDFAST FENCE": "7"})
    assert gate.process.wait(30) != 0 and not marker.exists()


def test_a_gate_sources_no_file_by_its_path(tmp_path: Path) -> None:
    """The environment reaches the gate in a file with no name: nothing in a directory another
    user may write (a TMPDIR without the sticky bit) can be swapped for a file of theirs, which a
    root gate sourced."""
    out = tmp_path / "fence"
    gate = Gate(["sh", "-c", f'printf %s "$HOLDFAST_FENCE" > {out}'], dict(os.environ), env_at_release=True)
    argv = gate.process.args
    assert isinstance(argv, list) and all(str(tmp_path) not in arg for arg in argv[:-3])
    assert ". /dev/fd/" in argv[2]
    gate.release({"HOLDFAST_FENCE": "7"})
    assert gate.process.wait(30) == 0 and out.read_text() == "7"
