"""A tree whose gate could move a process out of the session cgroup is never proven gone by that
cgroup's emptiness alone (proc/cgroups_rules.py): an escaped process that makes its memory
unreadable (tests/integration/stuck_fuse.py) is then counted by neither the cgroup nor the scan,
and the answer must stay unproven while it lives. So is one whose kernel lets it take what a process
outside it holds open (no Yama, or kernel.yama.ptrace_scope 0). A gate that truly cannot leave still
gets CGROUP_ONLY where Yama keeps its ptrace to its descendants; these tests assert what the rule
says of the machine they run on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import select
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from holdfast.localstack.simhost import SimulatedHost, ns_pid
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.conftest import AgentProcess, descendants, mint_token, probe, wait_empty
from tests.integration.run_fixtures import Cluster
from tests.integration.stuck_fuse import CHILD, StuckFuse
from tests.integration.test_agent_stuck_environ import in_mmap, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [pytest.mark.root, pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0 or not cgroups.capability().able,
                                 reason="needs root and cgroup v2 in the node's namespace")]
ONLY, AND_SCAN = agent_pb2.CGROUP_ONLY, agent_pb2.CGROUP_AND_SCAN
VAR = "HOLDFAST_SPAWN_TOKEN"
PYTHON = "/usr/bin/python3"  # a gate needs nothing of holdfast, and nobody may run it
NOBODY_NNP = ["setpriv", "--no-new-privs", "--reuid=65534", "--regid=65534", "--clear-groups"]
# A gate: says it is ready, then waits to be told to go, as `run`'s gate waits on its pipe.
GATE = "import os; os.write(1, b'r'); os.read(0, 1)"
# A gate that gives up everything but a saved uid and gid 0, from which it may set them again: with
# no-new-privileges and no capability left.
REGAINS_ROOT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
os.setgroups([])
os.setresgid(65534, 65534, 0)
os.setresuid(65534, 65534, 0)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
assert libc.capset(header, (ctypes.c_uint32 * 6)()) == 0, "dropping every capability"
"""
# A mount namespace of its own in which the cgroup2 hierarchy is mounted read-only.
READ_ONLY_CGROUPS = ["unshare", "--mount", "sh", "-c", 'mount -o remount,bind,ro "$0" && exec "$@"',
                     cgroups.cgroup2_root()]


def root_procs() -> str:
    return os.path.join(cgroups.cgroup2_root(), "cgroup.procs")


def yama_holds() -> bool:
    """Whether Yama keeps a tree's ptrace to its own descendants here (kernel.yama.ptrace_scope ≥ 1)."""
    scope = cgroups.ptrace_scope()
    return scope is not None and scope >= 1


def assert_held_as_yama_says(proof: int, why: str) -> None:
    """A gate with no way out of its own: held by its cgroup alone where Yama holds, else not."""
    if yama_holds():
        assert proof == ONLY, why
    else:
        assert proof == AND_SCAN and "may be ptraced (kernel.yama.ptrace_scope is" in why, why


@contextlib.contextmanager
def pod_cgroup() -> Iterator[Path]:
    path = Path(cgroups.cgroup2_root()) / f"escape-test-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        yield path
    finally:
        wait_empty(path)
        path.rmdir()


@contextlib.contextmanager
def gate(argv: Sequence[str], parent: Path | None = None) -> Iterator[tuple[int, agent_pb2.CgroupRef | None]]:
    """A gate started by `argv` (only exec'ing down to the Python that says it is ready), moved into
    `parent` if given, then into a session cgroup as AttestSpawn moves it: (its pid, that cgroup)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ref = None
    try:
        assert proc.stdout is not None and proc.stdout.read(1) == b"r"
        if parent is not None:
            (parent / "cgroup.procs").write_text(str(proc.pid))
        ref, why = cgroups.make_session_cgroup(proc.pid, f"escape-{secrets.token_hex(4)}", 1,
                                               cgroups.capability())
        assert ref is not None, why
        yield proc.pid, ref
    finally:
        proc.kill()
        proc.wait()
        if ref is not None:
            wait_empty(Path(ref.path))
            os.rmdir(ref.path)


def proof_of(argv: Sequence[str], parent: Path | None = None) -> tuple[int, str]:
    with gate(argv, parent) as (pid, ref):
        return cgroups.tree_proof(pid, ref, cgroups.capability())


def test_a_gate_without_any_way_out_is_held_by_its_cgroup(tmp_path: Path) -> None:
    confined = [*NOBODY_NNP, "--inh-caps=-all", "--", PYTHON, "-c", GATE]
    assert_held_as_yama_says(*proof_of(confined))
    # A log its starter opened before giving it a mount namespace of its own (a unit's
    # StandardOutput=file: with PrivateTmp=): placed by the agent's mounts, not a cgroup file.
    log = str(tmp_path / "log")
    assert_held_as_yama_says(*proof_of(["sh", "-c", 'exec 3>>"$0" unshare --mount "$@"', log, *confined]))



# `run`'s own gate (client/gate.py), spawned by an unprivileged, no-new-privileges process as in a
# pod: its pid printed, then it waits on its pipe as before a grant.
RUNS_GATE = """
import os, sys
from holdfast.client.gate import Gate
gate = Gate(["true"], dict(os.environ), process_group=0, env_at_release=True)
print(gate.pid, flush=True)
sys.stdin.read()
gate.abort()
"""


def test_runs_own_gate_unprivileged_is_held_by_its_cgroup() -> None:
    """The memory file a gate sources its grant's environment from is held read-only by the gate: a
    descriptor open for writing on a file in no mount the agent knows could be a cgroup.procs."""
    python, extra = unprivileged.interpreter()
    runner = subprocess.Popen([*NOBODY_NNP, "--inh-caps=-all", "--", python, "-c", RUNS_GATE],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **extra},
                              cwd="/")
    ref = None
    try:
        assert runner.stdout is not None
        pid = int(runner.stdout.readline())
        ref, why = cgroups.make_session_cgroup(pid, f"escape-{secrets.token_hex(4)}", 1, cgroups.capability())
        assert ref is not None, why
        assert_held_as_yama_says(*cgroups.tree_proof(pid, ref, cgroups.capability()))
    finally:
        runner.communicate(timeout=30)
        if ref is not None:
            wait_empty(Path(ref.path))
            os.rmdir(ref.path)


@pytest.mark.parametrize(("argv", "expected"), [
    # systemd's User=nobody, NoNewPrivileges=yes, AmbientCapabilities=CAP_DAC_OVERRIDE
    ([*NOBODY_NNP, "--inh-caps=+dac_override", "--ambient-caps=+dac_override", "--", PYTHON, "-c", GATE],
     "capabilities"),
    ([PYTHON, "-c", REGAINS_ROOT + GATE], "uid 0"),
    # root without CAP_SYS_ADMIN, its cgroup2 mount read-only: it writes through /proc/<pid>/root of a
    # process in the machine's mount namespace
    ([*READ_ONLY_CGROUPS, "setpriv", "--bounding-set=-sys_admin", "--", PYTHON, "-c", GATE], "privileges"),
    # and with nothing but its uid 0 (no-new-privileges, no capability)
    ([*READ_ONLY_CGROUPS, "setpriv", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--", PYTHON,
      "-c", GATE], "uid 0"),
    # a root shell's redirection before it dropped to nobody: the descriptor writes as root
    (["sh", "-c", 'exec 3>>"$0" "$@"', root_procs(), *NOBODY_NNP, "--inh-caps=-all", "--", PYTHON, "-c",
      GATE], "open for writing"),
], ids=["ambient-dac-override", "saved-uid-0", "root-read-only-mount", "bare-root-read-only-mount",
        "descriptor-opened-by-root"])
def test_a_gate_with_a_way_out_needs_the_scan_too(argv: list[str], expected: str) -> None:
    proof, why = proof_of(argv)
    assert proof == AND_SCAN and expected in why, why


def test_a_cgroup_procs_its_gate_owns_is_a_way_out_whatever_its_mode() -> None:
    with pod_cgroup() as pod:
        procs = pod / "cgroup.procs"
        os.chown(procs, 65534, 65534)
        os.chmod(procs, 0o444)  # its owner may chmod it back
        proof, why = proof_of([*NOBODY_NNP, "--inh-caps=-all", "--", PYTHON, "-c", GATE], parent=pod)
    assert proof == AND_SCAN and str(procs) in why, why


# The gate above, once attested: a child takes back uid and gid 0, moves itself to the hierarchy's
# root, and makes its memory unreadable (stuck_fuse.CHILD, given as its code, told on the pipes
# given); the gate says the child's pid and exits.
ESCAPES = REGAINS_ROOT + r"""
import sys
fuse, ready, go, procs, child_code = sys.argv[1:6]
os.write(1, b"r")
os.read(0, 1)
child = os.fork()
if child == 0:
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
    os.execv(sys.executable, [sys.executable, "-c", child_code, fuse, ready, go])
os.write(1, b"%d\n" % child)
"""


def test_a_child_that_regains_root_leaves_the_cgroup_and_hides_is_not_proven_gone(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "host-escape")
    mountpoint = tmp_path / "fuse"
    mountpoint.mkdir()
    escapee = -1  # a pidfd of the escapee, which is not this process's child
    cgroup: Path | None = None
    try:
        with StuckFuse(mountpoint) as fuse:
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            token = mint_token()
            argv = [PYTHON, "-c", ESCAPES, str(fuse.file), str(ready_w), str(go_r), root_procs(), CHILD]
            root = subprocess.Popen(argv, env={"PATH": os.environ["PATH"], VAR: token}, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, pass_fds=(ready_w, go_r))
            os.close(ready_w)
            os.close(go_r)
            try:
                assert root.stdin is not None and root.stdout is not None and root.stdout.read(1) == b"r"
                request = agent_pb2.AttestSpawnRequest(spawn_token=token, pid_hint=root.pid,
                                                       session_id="escape-session", fence=1)
                identity = agent.stub.AttestSpawn(request, timeout=10).identity
                assert identity.cgroup.path, identity.tree_proof_reason
                cgroup = Path(identity.cgroup.path)
                root.stdin.write(b"g")
                root.stdin.close()
                escapee_pid = int(root.stdout.readline())
                escapee = os.pidfd_open(escapee_pid)
                assert os.read(ready_r, 1) == b"m"
                assert fuse.read_asked.wait(10), "the escapee's own read never reached the daemon"
                os.write(go_w, b"g")
                until("the escapee queued for its mmap lock", lambda: in_mmap(escapee_pid))
                assert root.wait(10) == 0
                wait_empty(cgroup)  # the root exited, the escapee left

                verdict = probe(agent.stub, identity, check_tree=True)
                assert verdict.outcome == agent_pb2.PID_ABSENT
                assert verdict.tree_checked and not verdict.tree_gone, verdict
                assert "could not be read" in verdict.tree_reason, verdict
                assert identity.tree_proof == AND_SCAN, identity.tree_proof_reason
            finally:
                if escapee >= 0:
                    signal.pidfd_send_signal(escapee, signal.SIGKILL)
                root.kill()
                root.wait()
                os.close(ready_r)
                os.close(go_w)
                if cgroup is not None:
                    wait_empty(cgroup)
                    cgroup.rmdir()
        # The daemon gone, the escapee's read returns and the kill ends it.
        if escapee >= 0:
            assert select.select([escapee], [], [], 10)[0], "the escapee outlived its kill"
            os.close(escapee)
    finally:
        agent.stop()


# Like a systemd unit with User=nobody, NoNewPrivileges=yes, AmbientCapabilities=CAP_DAC_OVERRIDE.
NOBODY_NNP_DAC = [*NOBODY_NNP, "--inh-caps=+dac_override", "--ambient-caps=+dac_override", "--"]
# Like an unprivileged pod's or unit's: nobody, no-new-privileges, no capability.
NOBODY_NNP_BARE = [*NOBODY_NNP, "--inh-caps=-all", "--"]
# A process of the tree: a session of its own, moved to the hierarchy's root, its pid said on the
# `ready` FIFO, then stuck_fuse.CHILD on the FIFOs. `way` is the root's cgroup.procs (its capability
# writes it), or the pid of a process outside the tree whose descriptor 3 is that file opened for
# writing: taken with pidfd_getfd(2) (syscall 438), and where that is refused "refused ERRNO" is said.
ESCAPEE = r"""
import ctypes, os, sys
fuse, way, ready_path, go_path, child_code = sys.argv[1:6]
os.setsid()
ready = os.open(ready_path, os.O_WRONLY)
go = os.open(go_path, os.O_RDONLY)
if way.startswith("/"):
    procs = os.open(way, os.O_WRONLY)
else:
    procs = ctypes.CDLL(None, use_errno=True).syscall(438, os.pidfd_open(int(way)), 3, 0)
    if procs < 0:
        os.write(ready, b"refused %d\n" % ctypes.get_errno())
        sys.exit(1)
os.write(procs, b"%d" % os.getpid())
os.write(ready, b"%d\n" % os.getpid())
sys.argv = [sys.argv[0], fuse, str(ready), str(go)]
exec(child_code)
"""


@contextlib.contextmanager
def outsider(host: SimulatedHost) -> Iterator[int]:
    """A nobody process on `host`, in no session, waiting, whose root starter opened the hierarchy
    root's cgroup.procs for writing as its descriptor 3 before dropping to nobody: its pid there."""
    proc = host.spawn(["sh", "-c", 'exec 3>>"$0" "$@"', root_procs(), *NOBODY_NNP_BARE, PYTHON, "-c", GATE],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.read(1) == b"r"
        yield host.host_pid(proc)
    finally:
        proc.communicate(timeout=10)  # its stdin closed, it ends


@pytest.fixture
def shared() -> Iterator[Path]:
    path = unprivileged.shared_dir("holdfast-escape-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("way", ["capability", "outsider"])
def test_a_tree_that_left_its_cgroup_and_hides_keeps_its_session(way: str, cluster: Cluster,
                                                                 shared: Path) -> None:
    """The tree's gate has a way out of its own (an ambient CAP_DAC_OVERRIDE), or none but the kernel
    lets a process of the tree take what a process of its uid outside it holds open: a cgroup.procs
    its root starter opened for writing. Where Yama refuses that take (scope ≥ 1), the gate is held
    by its cgroup alone and nothing of the tree leaves."""
    sid = f"escape-{secrets.token_hex(4)}"
    ready, go, end = shared / "ready", shared / "go", shared / "end"
    for fifo in (ready, go, end):
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)  # past the umask: a tree without CAP_DAC_OVERRIDE opens them too
    mountpoint = shared / "fuse"  # not in pytest's tmp, which a tree without CAP_DAC_OVERRIDE cannot reach
    mountpoint.mkdir()
    marker = shared / "second-ran"
    escapee = -1  # a pidfd of the escapee
    cgroup = ""
    try:
        # before the hosts, so they see it
        with StuckFuse(mountpoint, allow_other=True) as fuse, contextlib.ExitStack() as stack:
            a, b = cluster.host("host-a"), cluster.host("host-b")
            if way == "capability":
                drop, target, expected = NOBODY_NNP_DAC, root_procs(), "capabilities"
            else:
                # Its stdout and stderr opened in host-a's mount namespace: the ones cluster.run opens
                # in the machine's are on mounts host-a's agent cannot place, which count as cgroup files.
                drop = ["sh", "-c", 'exec >/dev/null 2>"$0" "$@"', str(shared / "run.err"), *NOBODY_NNP_BARE]
                target = str(stack.enter_context(outsider(a)))
                expected = "may be ptraced (kernel.yama.ptrace_scope is"
            root = ['"$@" & read x < "$0"', str(end), PYTHON, "-c", ESCAPEE, str(fuse.file), target,
                    str(ready), str(go), CHILD]
            owner = cluster.run(a, sid, cmd=["sh", "-c", *root], as_nobody=True, drop=drop)
            try:
                with open(ready, "rb", buffering=0) as said, open(go, "wb", buffering=0) as told:
                    line = said.readline()
                    refused = way == "outsider" and yama_holds()
                    if refused:  # Yama keeps the tree's ptrace to its descendants: held by its cgroup alone
                        assert line == b"refused %d\n" % errno.EPERM, line
                        lease = cluster.record(sid).record.lease
                        assert lease.owner.tree_proof == ONLY, lease.owner.tree_proof_reason
                        cgroup = lease.owner.cgroup.path
                        end.write_text("end\n")
                        return
                    escapee_pid = next(p for p in descendants(owner.proc.pid) if ns_pid(p) == int(line))
                    escapee = os.pidfd_open(escapee_pid)
                    assert said.read(1) == b"m"
                    assert fuse.read_asked.wait(10), "the escapee's own read never reached the daemon"
                    told.write(b"g")
                    until("the escapee queued for its mmap lock", lambda: in_mmap(escapee_pid))
                    os.kill(owner.run_pid, signal.SIGKILL)  # the owner's `run` dies ...
                    owner.wait(30)
                    end.write_text("end\n")  # ... and the tree's root exits: the cgroup is empty
                    lease = cluster.record(sid).record.lease
                    cgroup = lease.owner.cgroup.path
                    wait_empty(Path(cgroup))

                    waited = cluster.run(b, sid, "--wait", "5", cmd=["touch", str(marker)])
                    assert waited.wait(60) == 75, waited.err()
                    assert "OWNERSHIP_UNKNOWN" in waited.err()
                    assert not marker.exists() and not select.select([escapee], [], [], 0)[0]
                    after = cluster.record(sid).record.lease
                    assert after.fence == 1 and after.claim_status == pb.LIVE  # a refusal wrote nothing
                    assert lease.owner.tree_proof == AND_SCAN and expected in lease.owner.tree_proof_reason, (
                        lease.owner.tree_proof_reason)
            finally:
                if escapee >= 0:
                    signal.pidfd_send_signal(escapee, signal.SIGKILL)
    finally:
        if escapee >= 0:  # its read returned when the daemon went, and the kill ended it
            select.select([escapee], [], [], 10)
            os.close(escapee)
        if cgroup:  # the session's cgroups, empty now; their agents' sweeps would take them only later
            for made in Path(cgroup).parent.glob(f"holdfast-{sid}-*"):
                wait_empty(made)
                made.rmdir()
