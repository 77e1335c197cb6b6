"""The soak's own derivations from raw evidence: a grant resting on a probe answer timed inside its
agent's SIGSTOP window, and a write sent after a newer fence's child started yet acknowledged, both
become violations (pure logic over recorded data); a writer caught mid-fork is one tree (its
process-table sampler, over real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from holdfast.v1 import coordinator_pb2 as pb
from tests.faults.history import Event, check
from tests.faults.workload import Soak


def _soak(tmp: Path) -> Soak:
    return Soak(cluster=None, tmp=tmp, seed=1, sessions=1)  # type: ignore[arg-type]


def test_a_probe_answer_from_a_stopped_agent_is_an_indeterminate_grant(tmp_path: Path) -> None:
    soak = _soak(tmp_path)
    timed = [(1, Event(0, "grant", "soak-session-0", 1, "h0")),
             (5, Event(0, "grant", "soak-session-0", 2, "h1"))]
    soak.agent_silences = [("h0", 1000, 3000)]
    soak.evidence = {("soak-session-0", 2): pb.DeathEvidence(kind="pid-absent", observed_at_unix_ms=2000,
                                                              owner_fence=1)}
    found = soak._indeterminate_grants(timed)
    assert [e.kind for _, e in found] == ["indeterminate-grant"]
    soak.evidence[("soak-session-0", 2)].observed_at_unix_ms = 3500  # answered after SIGCONT: fine
    assert soak._indeterminate_grants(timed) == []
    soak.evidence[("soak-session-0", 2)].CopyFrom(pb.DeathEvidence(kind="released", observed_at_unix_ms=2000,
                                                                   owner_fence=1))
    assert soak._indeterminate_grants(timed) == []  # a release needs no probe


def test_an_ack_of_a_write_sent_after_a_newer_fence_started_is_stale(tmp_path: Path) -> None:
    soak = _soak(tmp_path)
    soak.session_log("soak-session-0").write_text(
        "start soak-session-0 1 h0 10 0 100\n"
        "start soak-session-0 2 h1 20 0 200\n"
        "send soak-session-0 1 h0 10 7 300\n"
        "ack soak-session-0 1 h0 10 7 400\n")
    events = [e for _, e in soak._log_events("soak-session-0")]
    assert "put-stale-ack" in [e.kind for e in events]
    ordered = [Event(n, e.kind, e.session, e.fence, e.host, e.key) for n, e in enumerate(events, 1)]
    assert "a stale-fence write was accepted" in {v.rule for v in check(ordered)}


_FORKING_WRITER = """\
import os, sys, time
child = os.fork()
if child == 0:
    print(os.getpid(), flush=True)  # a writer's fork before it execs: the writer's argv and environ
    time.sleep(60)
    os._exit(0)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_writer_seen_mid_fork_is_one_tree_not_two(tmp_path: Path) -> None:
    """A process-table sample taken between a writer's fork and its exec sees two processes with the
    writer's argv and fence; the sampler counts the writer once (a soak failed on it)."""
    soak = _soak(tmp_path)
    Path(soak.child_script).write_text(_FORKING_WRITER)
    env = {**os.environ, "HOLDFAST_SESSION": "soak-session-0", "HOLDFAST_FENCE": "5"}
    proc = subprocess.Popen([sys.executable, soak.child_script], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = {int(proc.stdout.readline()), int(proc.stdout.readline())}
    try:
        assert pids == {proc.pid, *pids} and len(pids) == 2
        assert soak.children_alive() == [(proc.pid, "soak-session-0", 5)]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
