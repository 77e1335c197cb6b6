"""proc/scan.py: a zombie proven dead before the scan began settles the first pass it is seen in,
but only when it is that very process (same start ticks and pidfs inode); any other zombie needs
the second pass that shows it unchanged. Run in a private pid namespace, where the only processes
are the scanning interpreter and its zombie, so the pass counts are exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(60)]

# What both scripts share: a process seen dead as the agent sees it, its start ticks and pidfs inode
# taken while it lives, then told to exit (its pipe closed) and its exit seen on its pidfd.
PRELUDE = r"""
import json, os, select, sys, time
from holdfast.proc.procstat import parse_stat
from holdfast.proc.scan import scan


def seen_dead(pid, tell):
    pidfd = os.pidfd_open(pid)
    inode = os.fstat(pidfd).st_ino
    with open(f"/proc/{pid}/stat", "rb") as f:
        ticks = parse_stat(f.read()).start_ticks
    os.close(tell)
    assert select.select([pidfd], [], [], 10)[0], f"{pid} did not exit"
    return ticks, inode
"""

SCRIPT = PRELUDE + r"""
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)  # exits once told, then stays a zombie: its parent never reaps it
    os._exit(0)
os.close(r)
ticks, inode = seen_dead(child, w)
claims = {
    "nothing proven": {},
    "that very process": {child: (ticks, inode)},
    "another inode": {child: (ticks, inode + 1)},
    "other start ticks": {child: (ticks + 1, inode)},
    "no pidfs inode": {child: (ticks, 0)},
}
found = {}
for name, dead in claims.items():
    result = scan(b"HOLDFAST_TEST_DEAD_ROOT", b"t" * 32, dead=dead)
    found[name] = [result.passes, result.stable]
print(json.dumps(found))
"""


def test_the_agents_scan_goes_on_past_a_first_pass_that_did_not_settle() -> None:
    """A zombie nothing proved dead unsettles the first pass, which the agent tries on its event
    loop; the scan then runs again on a reader thread (agent/reads.py), where its second pass settles."""
    if os.geteuid() != 0:
        pytest.skip("a private pid namespace needs root")
    script = PRELUDE + AGENT + r"""
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)
    os._exit(0)
os.close(r)
seen_dead(child, w)
result = scan(service.variable, b"t" * 32, born_since=1)  # a tree scan: every process is younger
print(json.dumps([result.passes, result.stable, 0 < service.listed <= INLINE_LISTING]))
"""
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [2, True, True]


def test_only_the_zombie_proven_dead_before_the_scan_settles_its_first_pass() -> None:
    if os.geteuid() != 0:
        pytest.skip("a private pid namespace needs root")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", SCRIPT],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {
        "nothing proven": [2, True],
        "that very process": [1, True],
        "another inode": [2, True],
        "other start ticks": [2, True],
        "no pidfs inode": [2, True],
    }


HOPPING = PRELUDE + r"""
SCAN = scan
VARIABLE, TOKEN = "HOLDFAST_TEST_DEAD_ROOT", "h" * 32
ROOT = '''
import os, sys, time
HOPS = 10000
r, stop = int(sys.argv[1]), sys.argv[2]
if os.fork() == 0:  # the hopper: forks, and the parent exits, over and over, carrying the token
    os.close(r)
    deadline = time.monotonic() + 60
    # Each hop leaves its parent a zombie of the namespace's init, which never reaps them: unbounded,
    # they filled the machine's pid space (16,000 on a quiet machine; under load fork and thread
    # creation failed machine-wide, in other tests too). After HOPS it stays put, a carrier still;
    # most scans beside it run while it hops (a rule widened to every zombie is caught in each run).
    hops = 0
    while not os.path.exists(stop) and time.monotonic() < deadline:
        if hops < HOPS:
            hops += 1
            if os.fork():
                os._exit(0)
        else:
            time.sleep(0.01)
    os._exit(0)
os.read(r, 1)  # the root exits once told, and stays a zombie: its parent never reaps it
'''
r, w = os.pipe()
os.set_inheritable(r, True)
root = os.fork()
if root == 0:
    os.close(w)
    os.execve(sys.executable, [sys.executable, "-c", ROOT, str(r), sys.argv[1]], {VARIABLE: TOKEN})
os.close(r)
ticks, inode = seen_dead(root, w)
claimed_gone = 0
for _ in range(12):  # the hopper hops on until STOP: every scan here runs beside it
    result = SCAN(VARIABLE.encode(), TOKEN.encode(), born_since=ticks, dead={root: (ticks, inode)})
    claimed_gone += result.stable and not result.carriers
open(sys.argv[1], "w").close()
print(json.dumps({"claimed_gone": claimed_gone}))
"""


# The agent's own scan: its first pass tried on the event loop (a small process table), and run again
# on a reader thread when that pass did not settle.
AGENT = r"""
import asyncio
from holdfast.agent import hostinfo
from holdfast.agent.service import INLINE_LISTING, HostAgentService

service = HostAgentService("host-local", hostinfo.gather(), "HOLDFAST_TEST_DEAD_ROOT")


def scan(variable, token, born_since=0, dead=None):
    assert variable == service.variable
    service.listed = INLINE_LISTING  # as after a scan of a small table: this first pass on the loop
    return asyncio.run(service.reading(service.scan, token, born_since, dead))
"""


@pytest.mark.parametrize("scanner", ["scan", "agent"])
def test_a_dead_root_settling_at_once_never_hides_its_hopping_tree(tmp_path: Path, scanner: str) -> None:
    """The root is proven dead (and settles at once); its descendant hops (forks, the parent exits,
    again and again) carrying the token. No scan may call that tree gone: nor the agent's, whose
    first pass it tries on its event loop and, unsettled there, runs again on a reader thread."""
    if os.geteuid() != 0:
        pytest.skip("a private pid namespace needs root")
    script = HOPPING.replace("SCAN = scan\n", AGENT + "SCAN = scan\n") if scanner == "agent" else HOPPING
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                           "-c", script, str(tmp_path / "stop")], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"claimed_gone": 0}
