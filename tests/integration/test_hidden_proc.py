"""An agent that may not ptrace-read an owner, on a /proc that hides what it may not read, or
without the right to signal it: what it cannot see or end is never taken as ended.

The agent's own observe, judge, scan and tree verdict run as nobody (no capability) in a private
pid and mount namespace whose /proc is remounted with each hidepid option, against a live token
carrier of root's; and its kill_tree, as nobody, against a live root process, whose SIGKILL the
kernel refuses (EPERM: no CAP_KILL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60)]

NOBODY = 65534
# Root starts a carrier of the token and takes its identity, as an attestation does; a child drops
# to nobody (no groups, and with root's uid every capability goes) and looks at it as the agent does.
# The child is made dumpable again, as an agent started as nobody is: otherwise its own /proc files
# stay root's and it reads itself as unreadable, which alone would keep every scan incomplete.
PRELUDE = r"""
import ctypes, json, os, subprocess, sys
from holdfast.agent import probe_rules
from holdfast.agent.kill import Stopped, kill_tree
from holdfast.agent.observe import observe, observe_tree
from holdfast.proc import cgroups
from holdfast.proc.environ import plain_environ
from holdfast.proc.procstat import parse_stat
from holdfast.proc.scan import scan
from holdfast.v1 import agent_pb2

VAR, TOKEN, NOBODY = "HOLDFAST_TEST_HIDDEN", "h" * 32, 65534
INC = agent_pb2.HostIncarnation(machine_id="0f" * 16, boot_id="b", pid_ns=1, ns_init_start_ticks=1)
CAP = cgroups.Capability(root="", namespace=0, able=False, reason="none in this test")
carrier = subprocess.Popen(["sleep", "600"], env={VAR: TOKEN})
pidfd = os.pidfd_open(carrier.pid)
with open(f"/proc/{carrier.pid}/stat", "rb") as f:
    ticks = parse_stat(f.read()).start_ticks
identity = agent_pb2.ProcessIdentity(
    host_id="h", incarnation=INC, pid=carrier.pid, start_ticks=ticks, pidfd_ino=os.fstat(pidfd).st_ino,
    spawn_token=TOKEN, spawn_token_env=VAR, tree_proof=agent_pb2.CGROUP_AND_SCAN)


def as_nobody(look):
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            assert ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0) == 0  # PR_SET_DUMPABLE
            os.write(w, json.dumps(look()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as answer:
        said = answer.read()
    os.waitpid(child, 0)
    return json.loads(said)
"""

OBSERVE = PRELUDE + r"""
from holdfast.proc.scan import listing_hidden


def look():
    seen = observe(identity, VAR.encode(), False, plain_environ)
    verdict = probe_rules.judge(identity, "h", INC, seen, VAR)
    found = scan(VAR.encode(), TOKEN.encode(), born_since=ticks)
    state, why = probe_rules.tree_verdict(identity, observe_tree(identity, found, CAP), VAR)
    return {"outcome": agent_pb2.ProbeOutcome.Name(verdict.outcome), "reason": verdict.reason,
            "tree": agent_pb2.TreeState.Name(state), "tree_reason": why, "enumerable": found.enumerable,
            "hidden": listing_hidden("/proc")}


subprocess.run(["mount", "-o", f"remount,{sys.argv[1]}", "/proc"], check=True)
print(json.dumps({**as_nobody(look), "alive": carrier.poll() is None}))
carrier.kill()
"""

# Root, in the namespace, mounts a file of its own over one the scan reads (argv[1], {pid}: the
# carrier's): a pid counter that never moves over /proc/loadavg (as LXCFS's cached one), or an
# environ without the token over the live carrier's. The tree judged is argv[2]'s token's.
OVERMOUNT = PRELUDE + r"""
import tempfile
from holdfast.proc.scan import last_pid, listing_hidden

target = sys.argv[1].format(pid=carrier.pid)
with tempfile.NamedTemporaryFile(delete=False) as fake:
    fake.write(b"0.00 0.00 0.00 1/1 999999\n" if target.endswith("loadavg") else b"PATH=/bin\0")
subprocess.run(["mount", "--bind", fake.name, target], check=True)
identity.spawn_token = sys.argv[2]
found = scan(VAR.encode(), sys.argv[2].encode(), born_since=ticks)
state, why = probe_rules.tree_verdict(identity, observe_tree(identity, found, CAP), VAR)
print(json.dumps({"tree": agent_pb2.TreeState.Name(state), "tree_reason": why, "target": target,
                  "hidden": listing_hidden("/proc"), "last_pid": last_pid("/proc", os.stat("/proc").st_dev),
                  "alive": carrier.poll() is None}))
carrier.kill()
os.unlink(fake.name)
"""

KILL = PRELUDE + r"""


def look():
    killed = kill_tree(identity, VAR.encode(), True, CAP, plain_environ, Stopped())
    return {"sent": killed.sent, "refused": list(killed.refused)}


print(json.dumps({**as_nobody(look), "alive": carrier.poll() is None, "pid": carrier.pid}))
carrier.kill()
"""


def _run(script: str, *args: str, namespaces: tuple[str, ...] = ()) -> dict[str, object]:
    done = subprocess.run([*namespaces, sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=30)
    if done.returncode and namespaces and "unshare failed" in done.stderr:
        pytest.skip(f"the kernel refused a private pid and mount namespace: {done.stderr.strip()}")
    if done.returncode and "remount" in done.stderr and "mount:" in done.stderr:
        pytest.skip(f"the kernel refused to remount /proc {args}: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


PRIVATE = ("unshare", "--mount", "--pid", "--fork", "--mount-proc")


def _in_namespace(option: str) -> dict[str, object]:
    if os.geteuid() != 0:
        pytest.skip("remounting /proc in a private pid and mount namespace needs root")
    return _run(OBSERVE, option, namespaces=PRIVATE)


@pytest.mark.parametrize("option", ["hidepid=invisible", "hidepid=ptraceable"])
def test_a_live_owner_hidden_by_proc_is_neither_absent_nor_a_gone_tree(option: str) -> None:
    """/proc/<pid> reads ENOENT to nobody, and the listing leaves the carrier out: without its pidfd
    and the mount's options, that was PID_ABSENT and a stable, complete scan: TREE_GONE."""
    seen = _in_namespace(option)
    assert seen["alive"]
    assert seen["outcome"] == "INDETERMINATE" and "hides a live pid" in str(seen["reason"])
    assert seen["enumerable"] is False and option in str(seen["hidden"])
    assert seen["tree"] == "TREE_UNPROVEN" and option in str(seen["tree_reason"])


@pytest.mark.parametrize(("option", "outcome"), [
    ("hidepid=off", "IDENTITY_MATCHED"),  # stat readable, the environ not: the tree unproven
    ("hidepid=noaccess", "INDETERMINATE"),  # listed, every read refused (EPERM)
    ("hidepid=invisible,gid=65534", "IDENTITY_MATCHED"),  # nobody's group is exempt: listed, stat read
])
def test_a_listing_that_holds_the_owner_counts_it_unreadable(option: str, outcome: str) -> None:
    seen = _in_namespace(option)
    assert seen["alive"] and seen["outcome"] == outcome and seen["enumerable"] is True
    assert seen["hidden"] == "" and seen["tree"] == "TREE_UNPROVEN"
    assert "could not be read" in str(seen["tree_reason"])


# Over /proc/loadavg: a tree none is seen to carry, as one a pid wrap under the listing hid.
@pytest.mark.parametrize(("target", "token"), [("/proc/loadavg", "w" * 32),
                                               ("/proc/{pid}/environ", "h" * 32)])
def test_a_mount_over_what_a_scan_reads_never_proves_a_tree_gone(target: str, token: str) -> None:
    """Over /proc/loadavg the pid counter never moved, so no wrap could be seen, and the scan was
    complete; over the carrier's environ the carrier read as none: both were TREE_GONE."""
    if os.geteuid() != 0:
        pytest.skip("mounting over /proc files in a private pid and mount namespace needs root")
    seen = _run(OVERMOUNT, target, token, namespaces=PRIVATE)
    assert seen["alive"] and seen["tree"] == "TREE_UNPROVEN"
    said = f"{seen['target']} is mounted over what a scan reads in /proc"
    assert said in str(seen["hidden"]) and said in str(seen["tree_reason"])
    if target.endswith("loadavg"):
        assert seen["last_pid"] is None  # not the procfs's own counter: taken as a wrap


def test_a_kill_the_kernel_refuses_is_no_exit() -> None:
    """nobody's SIGKILL to root's process is refused (EPERM): reported refused, never counted sent
    nor taken as the process having exited since it was checked."""
    if os.geteuid() != 0:
        pytest.skip("a process of another uid to signal needs root to start it")
    seen = _run(KILL)
    assert seen["alive"] and seen["sent"] == 0
    assert seen["refused"] == [f"pid {seen['pid']} (SIGKILL): Operation not permitted"]
