"""`holdfast run` across simulated hosts: real etcd, coordinator, agents in PID namespaces, real
children. "Never two trees at once" is judged by the children's flock detector and the process
tables, never by holdfast's own word."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.conftest import descendants
from tests.integration.run_fixtures import Cluster, Run, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]


def gone(pid: int, timeout: float = 0.0) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def started(cluster: Cluster, fence: int, timeout: float = 20.0) -> list[str]:
    found = until(f"a child at fence {fence}",
                  lambda: [e for e in cluster.events("start") if e[1] == str(fence)], timeout)
    return found[0]  # type: ignore[index, no-any-return]


def child_pids(run) -> list[int]:  # type: ignore[no-untyped-def]
    return descendants(run.run_pid)


@contextlib.contextmanager
def frozen_owner(cluster: Cluster, host: SimulatedHost, sid: str) -> Iterator[tuple[Run, int]]:
    """A live owner of `sid` on `host` whose `run` is stopped, so it cannot react to a handoff
    request: its run and its CMD's pid; continued on leaving."""
    first = cluster.run(host, sid)
    started(cluster, 1)
    child = child_pids(first)[0]
    os.kill(first.run_pid, signal.SIGSTOP)
    try:
        yield first, child
    finally:
        # nsenter stops itself when its child stops (job control): continue both.
        os.kill(first.run_pid, signal.SIGCONT)
        os.kill(first.proc.pid, signal.SIGCONT)


def test_second_host_refused_while_first_lives_then_granted_on_the_agents_proof(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-crash-0001"
    first = cluster.run(a, sid)
    started(cluster, 1)
    refused = cluster.run(b, sid)
    assert refused.wait(30) == 75
    assert "HELD" in refused.err() and "host-a" in refused.err() and "--wait" in refused.err()
    # kill -9 of `run` and its child together: nothing is released.
    tree = [first.run_pid, *child_pids(first)]
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    first.wait(10)
    assert all(gone(pid, 5) for pid in tree)  # process table: the first tree is gone
    lease = cluster.record(sid).record.lease
    assert lease.fence == 1 and lease.claim_status == pb.LIVE and lease.owner.host_id == "host-a"
    # The session cgroup host-a's agent made for the gate at attestation is part of the identity.
    assert f"/holdfast-{sid}-1-" in lease.owner.cgroup.path and lease.owner.cgroup.inode, first.err()
    second = cluster.run(b, sid, "--wait", "30")
    started(cluster, 2)
    found = cluster.record(sid)
    lease = found.record.lease
    assert lease.fence == 2 and lease.owner.host_id == "host-b"
    # Granted only by host-a's agent's proof of death (exit or absence of the recorded root).
    assert lease.death_evidence.kind in ("exit-observed", "pid-absent")
    assert lease.death_evidence.owner_fence == 1
    # Each `run` committed by its grant, which names the gate it committed.
    assert [(h.transition, h.fence, h.detail.split(";")[0]) for h in found.history] == [
        ("grant", 1, "FREE"), ("grant", 2, "OWNER_DEAD")]
    assert found.history[-1].detail == f"OWNER_DEAD; committed pid {lease.owner.pid} on host-b"
    # SIGTERM to `run` is forwarded; the child exits 0 and `run` exits with its status.
    os.kill(second.run_pid, signal.SIGTERM)
    assert second.wait(30) == 0
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED
    assert not cluster.events("overlap")
    assert [e[1] for e in cluster.events("start")] == ["1", "2"]


def test_cooperative_handoff_waits_for_the_whole_old_tree(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-handoff-01"
    first = cluster.run(a, sid, "--grace", "5", cmd=cluster.child("--grandchild", "--handle", "thread-a"))
    started(cluster, 1)
    until("the first provider handle", lambda: cluster.record(sid).record.provider_handle_chain)
    old_tree = [p for p in child_pids(first)]
    second = cluster.run(b, sid, "--takeover", "--handoff-timeout", "20",
                         cmd=cluster.child("--handle", "thread-b"))
    start2 = started(cluster, 2)
    assert first.wait(30) == 0  # the old child took SIGTERM and exited 0
    assert "handoff requested by host host-b" in first.err()
    stops = {e[0]: int(e[4]) for e in cluster.log() if e[0] in ("stop", "grandchild-stop")}
    # B's child started only after every process of A's tree had ended (the grandchild is slow).
    assert stops["stop"] < int(start2[4]) and stops["grandchild-stop"] < int(start2[4])
    assert all(gone(pid) for pid in old_tree)
    assert not cluster.events("overlap")
    until("the second provider handle", lambda: len(cluster.record(sid).record.provider_handle_chain) == 2)
    record = cluster.record(sid).record
    assert [(link.handle, link.minted_at_fence) for link in record.provider_handle_chain] == [
        ("thread-a", 1), ("thread-b", 2)]
    # Each child was handed what to resume: the first nothing, the second host-a's handle in
    # HOLDFAST_PROVIDER_HANDLE and the chain in its grant file.
    assert [e[5:] for e in cluster.events("resumes")] == [["-", "-"], ["thread-a", "thread-a@1"]]
    fences = [h.fence for h in cluster.record(sid).history if h.transition == "grant"]
    assert fences == sorted(set(fences)) == [1, 2]
    os.kill(second.run_pid, signal.SIGTERM)
    assert second.wait(30) == 0


def test_frozen_owner_is_refused_then_force_has_its_agent_end_it(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-frozen-001"
    with frozen_owner(cluster, a, sid) as (first, child):
        refused = cluster.run(b, sid, "--takeover", "--handoff-timeout", "1")
        assert refused.wait(30) == 75
        assert "HELD" in refused.err()
        # The hint fits what was tried: --takeover did not suffice, so --force, not --takeover again.
        assert "did not let go within --handoff-timeout 1s; add `--force`" in refused.err()
        assert not gone(child)  # still A's live child, still the only tree
        # The one refusal that wrote (docs/guarantees.md 3): the request it delivered stands, and
        # the hint says so, since A's run may yet end its tree on it.
        assert cluster.record(sid).record.lease.handoff_stage == pb.HANDOFF_REQUESTED
        assert "it was asked" in refused.err()
        forced = cluster.run(b, sid, "--takeover", "--force", "--handoff-timeout", "1")
        started(cluster, 2)
        assert gone(child)  # A's agent killed A's tree before B was granted
        lease = cluster.record(sid).record.lease
        assert lease.fence == 2 and lease.owner.host_id == "host-b"
    # A's run wakes to a dead child and a fence that moved on: it has nothing to release.
    assert first.wait(30) == 128 + signal.SIGKILL
    assert "moved past fence 1" in first.err()
    assert not cluster.events("overlap")
    os.kill(forced.run_pid, signal.SIGTERM)
    assert forced.wait(30) == 0


def test_takeover_of_a_command_that_cannot_run_leaves_the_owner_untouched(cluster: Cluster) -> None:
    """Issue 17, safety 2: `run --takeover --force -- <typo>` used to end the live owner and then fail
    to exec. CMD is resolved first: 127 / 126, no handoff requested, nothing written."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-typo-0001"
    first = cluster.run(a, sid)
    started(cluster, 1)
    before = cluster.record(sid)
    not_executable = cluster.tmp / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    for cmd, code in ((["nosuchcmd-holdfast-typo"], 127), ([str(not_executable)], 126)):
        typo = cluster.run(b, sid, "--takeover", "--force", "--handoff-timeout", "1", cmd=cmd)
        assert typo.wait(30) == code, typo.err()
        assert "nothing was asked of the session's owner and nothing was written" in typo.err()
    after = cluster.record(sid)
    assert after.record == before.record and list(after.history) == list(before.history)
    assert after.record.lease.handoff_stage == pb.NONE and after.record.lease.fence == 1
    assert first.proc.poll() is None and child_pids(first), "the owner and its child still run"
    assert not cluster.events("stop") and not cluster.events("overlap")


def test_a_forced_takeover_of_a_session_run_inside_another_ends_only_its_own_tree(cluster: Cluster) -> None:
    """A `holdfast run` started from inside another session's tree (an agent session starting a
    sub-session) gets a session cgroup of its own, nested in the outer one. Forcing a takeover of
    the inner session `X` ends X's tree and nothing of `X-1`'s, whose cgroup name begins as X's
    would: matched by that prefix, the inner gate was once attested in the outer cgroup, and the
    force's cgroup.kill ended the outer session."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    outer_sid, inner_sid = "sess-nest-ci-1", "sess-nest-ci"
    inner = [sys.executable, "-m", "holdfast.cli", "run", "--session", inner_sid, "--grace", "30", "--",
             "sh", "-c", "trap '' TERM; exec sleep 600"]
    outer = cluster.run(a, outer_sid, cmd=["sh", "-c", shlex.join(inner) + " & exec sleep 600"])

    def live(sid: str) -> bool:
        records = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10).records
        return any(r.session_id == sid and r.lease.claim_status == pb.LIVE for r in records)

    until("both sessions live", lambda: live(outer_sid) and live(inner_sid))
    forced = cluster.run(b, inner_sid, "--takeover", "--force", "--handoff-timeout", "1", cmd=["true"])
    assert forced.wait(60) == 0
    assert cluster.record(inner_sid).record.lease.fence == 2
    lease = cluster.record(outer_sid).record.lease
    assert (lease.fence, lease.claim_status) == (1, pb.LIVE), "the outer session's tree was ended"
    assert outer.proc.poll() is None
    os.kill(outer.run_pid, signal.SIGTERM)
    outer.wait(30)


@pytest.mark.parametrize("as_nobody", [False, True], ids=["root", "unprivileged"])
def test_a_waiting_run_stopped_by_sigterm_ends_cleanly_and_disturbs_nothing(cluster: Cluster,
                                                                           as_nobody: bool) -> None:
    """SIGTERM (a service manager's stop, a pod's deletion) while `run --wait` waits for a held
    session, by root or by an unprivileged user: exit 143 as a shell reports it, one line, the
    report saying CMD never ran and why, its gate ended and no grant directory made (one is made
    only once granted); the holder and its record untouched."""
    sid = "sess-term-wait-01"
    holder = cluster.run(cluster.host("host-term-a"), sid, cmd=["sleep", "60"])
    held = until("the holder live", lambda: next((
        r for r in cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10).records
        if r.session_id == sid and r.lease.claim_status == pb.LIVE), None))
    reports = unprivileged.shared_dir("holdfast-term-report-")
    cluster.shared.append(reports)
    report = reports / "report.json"
    waiter = cluster.run(cluster.host("host-term-b"), sid, "--wait", "60", "--report", str(report),
                         cmd=["echo", "ran"], as_nobody=as_nobody)
    tmp = cluster.shared[-1] if as_nobody else cluster.tmp  # the waiter's TMPDIR
    gate = until("the waiter's gate", lambda: descendants(waiter.run_pid))
    # As root, the holder's grant directory alone: the waiter, not granted, has made none.
    assert len(sorted(tmp.glob("holdfast-run-*"))) == (0 if as_nobody else 1)
    os.kill(waiter.run_pid, signal.SIGTERM)
    assert waiter.wait(30) == 143, waiter.err()
    said = [line for line in waiter.err().splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("holdfast: TERMINATED: terminated (SIGTERM)"), said
    assert json.loads(report.read_text()) | {"message": "", "next_step": ""} == {
        "schema": "holdfast/v1", "ran": False, "exit_code": 143, "cmd_status": None, "reason": "TERMINATED",
        "message": "", "next_step": "", "session": sid, "fence": 0}
    assert all(gone(pid) for pid in gate)  # type: ignore[union-attr]
    assert len(sorted(tmp.glob("holdfast-run-*"))) == (0 if as_nobody else 1)
    assert cluster.record(sid).record == held and holder.proc.poll() is None


def test_a_handoff_of_an_unprivileged_run_ends_a_run_nested_in_it_and_its_tree(cluster: Cluster) -> None:
    """An unprivileged `run` whose CMD is another `holdfast run` (whose own CMD ignores SIGTERM):
    the inner tree sits in a session cgroup nested in the outer one and carries the inner token.
    Read as the outer cgroup's own cgroup.procs only, it was never signalled; the outer run, unable
    to write the agent's cgroup.kill, said it survived SIGKILL, never released, and left the inner
    CMD running unsupervised. Its handoff must end both trees, then release, then grant."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    outer_sid, inner_sid = "sess-nest-nobody-outer", "sess-nest-nobody-inner"
    shared = unprivileged.shared_dir("holdfast-nested-run-")
    cluster.shared.append(shared)
    up, lock = shared / "inner-up", shared / "tree.lock"
    os.mkfifo(up, 0o666)
    os.chmod(up, 0o666)
    python, _ = unprivileged.interpreter()
    # The inner CMD holds `lock` while it lives, and ignores SIGTERM (so does flock, its holder).
    inner_cmd = ["sh", "-c", f"trap '' TERM; exec flock {lock} sh -c 'echo up > {up}; exec sleep 600'"]
    outer = cluster.run(a, outer_sid, "--grace", "1", as_nobody=True,
                        cmd=[python, "-m", "holdfast.cli", "run", "--session", inner_sid, "--grace", "60",
                             "--", *inner_cmd])
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(up.read_text()), daemon=True)
    reader.start()
    reader.join(60)
    assert said == ["up\n"], outer.err()
    old_tree = descendants(outer.run_pid)
    fds = [os.pidfd_open(pid) for pid in old_tree]
    try:
        assert len(old_tree) >= 3  # the inner run, flock, its CMD
        # The taker's CMD fails if the old tree still holds the lock: nothing of it may overlap.
        taker = cluster.run(b, outer_sid, "--takeover", "--handoff-timeout", "30",
                            cmd=["flock", "--nonblock", "--conflict-exit-code", "9", str(lock), "true"])
        assert taker.wait(90) == 0, taker.err()
        outer.wait(30)
        assert all(select.select([fd], [], [], 0)[0] for fd in fds), "a process of the old tree lives"
    finally:
        for fd in fds:
            os.close(fd)
    # The outer run went on to release: first, or after the taker's agent proved its tree gone.
    assert "did not end" not in outer.err()
    assert (f"session {outer_sid} released at fence 1" in outer.err() or
            f"session {outer_sid} has moved past fence 1; nothing to release" in outer.err()), outer.err()
    fences = [h.fence for h in cluster.record(outer_sid).history if h.transition == "grant"]
    assert fences == [1, 2]
