"""A kill whose caller gave up is never done: with every reader thread of the agent busy (stuck in
reads of memory nobody can read, tests/integration/stuck_fuse.py), a KillOwner's kill waits for a
thread; its deadline passes, so the coordinator answers OWNERSHIP_UNKNOWN, and the kill must not
land when a thread frees up (nor an attestation's move, nor any job of a call that went away)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from holdfast.agent.kill import Stopped, kill_tree
from holdfast.agent.reads import MAX_WORKERS, Readers
from holdfast.agent.reads_rules import MAX_PARKED
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from tests.integration.conftest import AgentProcess, attest, mint_token, probe
from tests.integration.coordinator_fixtures import run_async
from tests.integration.run_fixtures import until
from tests.integration.stuck_fuse import CHILD, StuckFuse
from tests.integration.test_run_sessions import gone

pytestmark = [pytest.mark.timeout(120), pytest.mark.root]
P = agent_pb2.ProbeOutcome
HOST = "host-dropped"
# Processes whose environ reads never return. Each probe below reads them in turn, and each read
# holds its thread for STUCK_AFTER_S (0.5 s) before it is given up: three keep every thread busy
# for 1.5 s, the kill's deadline passing well inside that.
STUCK = 3
KILL_DEADLINE_S = 0.75


def sample(metrics: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return next((float(line.split()[1]) for line in lines if line.startswith(f"{name} ")), 0.0)


def syscalls(pid: int) -> list[list[str]]:
    """Each live thread's system call as the kernel shows it (number first, then its arguments)."""
    calls = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            calls.append(Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return calls


def reading_environ(agent_pid: int, pids: list[int]) -> int:
    """The agent's threads in a read (system call 0 on x86-64) of one of `pids`' environs: counted
    per process, since other tests' stuck processes on the host are none of this one's."""
    environs = {f"/proc/{pid}/environ" for pid in pids}
    count = 0
    for call in syscalls(agent_pid):
        if call[0] == "0":
            try:
                count += os.readlink(f"/proc/{agent_pid}/fd/{int(call[1], 16)}") in environs
            except FileNotFoundError:
                continue
    return count


def stuck_child(children: list, fuse: StuckFuse, token: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """A process every read of whose environ waits forever (`stuck_when_told`, told at once)."""
    child, stick = stuck_when_told(children, fuse, token)
    stick()
    return child


def stuck_when_told(children: list, fuse: StuckFuse,  # type: ignore[type-arg]
                    token: str) -> tuple[subprocess.Popen, Callable[[], None]]:  # type: ignore[type-arg]
    """A process (stuck_fuse.CHILD) whose environ reads well until `stick()`, and never returns
    after it: its own read of the page (pread64, 17) waits on the daemon, or behind the read of the
    page already waiting there; told, its main thread waits in mmap (9) for its memory's lock,
    behind that read."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(fuse.file), str(ready_w), str(go_r)],
                             env={"PATH": os.environ["PATH"], "HOLDFAST_SPAWN_TOKEN": token},
                             pass_fds=(ready_w, go_r))
    children.append(child)
    os.close(ready_w)
    os.close(go_r)
    assert os.read(ready_r, 1) == b"m"
    os.close(ready_r)
    until("its own read of the mapped page to wait", lambda: ["17"] in [c[:1] for c in syscalls(child.pid)])

    def stick() -> None:
        os.write(go_w, b"g")
        os.close(go_w)
        until("it to queue for its mmap lock",
              lambda: Path(f"/proc/{child.pid}/task/{child.pid}/syscall").read_text().split()[0] == "9")

    return child, stick


def mountpoint(tmp_path: Path, i: int) -> Path:
    path = tmp_path / f"fuse-{i}"
    path.mkdir()
    return path


def test_a_kill_whose_deadline_passed_while_it_waited_for_a_reader_is_never_done(
        tmp_path: Path, children: list) -> None:
    agent = AgentProcess(tmp_path, HOST, args=["--metrics-listen", "127.0.0.1:0"])
    metrics = json.loads((tmp_path / f"ready-{HOST}.json").read_text())["metrics"]
    try:
        token = mint_token()
        target = subprocess.Popen(["sleep", "300"],
                                  env={"PATH": os.environ["PATH"], "HOLDFAST_SPAWN_TOKEN": token})
        children.append(target)
        owner = attest(agent.stub, token, pid_hint=target.pid)
        # Known by its pidfd's inode: the kill's probe and exit watch read no environ, so they
        # answer on the agent's loop and the kill itself is what waits for a thread.
        assert owner.pidfd_ino, owner
        with contextlib.ExitStack() as mounts:
            # A filesystem each: a second open of a file whose page read is pending waits for it.
            hostile_token = mint_token()
            hostile = [stuck_child(children, mounts.enter_context(StuckFuse(mountpoint(tmp_path, i))),
                                   hostile_token) for i in range(STUCK)]
            owners = [agent_pb2.ProcessIdentity(
                host_id=HOST, incarnation=owner.incarnation, pid=h.pid, spawn_token=hostile_token,
                spawn_token_env=owner.spawn_token_env,
                start_ticks=int(Path(f"/proc/{h.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19]))
                for h in hostile]
            request = agent_pb2.ProbeOwnersRequest(owners=owners)
            probes = [agent.stub.ProbeOwners.future(request, timeout=60) for _ in range(MAX_WORKERS)]
            until("every reader thread stuck",
                  lambda: reading_environ(agent.proc.pid, [h.pid for h in hostile]) == MAX_WORKERS)
            with pytest.raises(grpc.RpcError) as late:
                agent.stub.KillOwner(agent_pb2.KillOwnerRequest(owner=owner), timeout=KILL_DEADLINE_S)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
            # Its caller gone, the kill that waited for a thread is dropped, never to run.
            until("the kill dropped", lambda: sample(metrics, "holdfast_agent_reads_dropped_total") == 1)
            assert sample(metrics, "holdfast_agent_reads_waiting") == 0
            assert all(p.running() for p in probes), "the threads freed up before the kill's deadline"
        # The connections aborted: every stuck read returns, and each probe answers.
        for answered in probes:
            assert len(answered.result(30).results) == STUCK
        assert not gone(target.pid), "a kill its caller gave up on was done afterwards"
        assert probe(agent.stub, owner).outcome == P.IDENTITY_MATCHED
        assert "killed owner tree" not in agent.log_path.read_text()
        for h in hostile:
            h.wait(10)
    finally:
        agent.stop()


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"T"


# MAX_PARKED: the run again reads the stopped carrier again. 1: the stuck read parked, no read starts
# at all, and the run again kills what the run given up stopped without reading it.
@pytest.mark.parametrize("parked_limit", [MAX_PARKED, 1], ids=["read-again", "no-read-again"])
@run_async
async def test_a_kill_given_up_on_a_stuck_read_is_run_again_to_its_end_though_its_caller_went_away(
        tmp_path: Path, children: list, parked_limit: int) -> None:  # type: ignore[type-arg]
    """The kill stops a carrier, then its next scan is stuck on a read and given up; the thread
    that frees is taken by another job first, so the kill's run again waits for one, and its caller
    goes away meanwhile. That run is the rest of a kill already under way: it must run, and kill
    the carrier the run given up left stopped (dropped, it would stay stopped for good)."""
    token = mint_token()
    carrier = subprocess.Popen(["sleep", "300"],
                               env={"PATH": os.environ["PATH"], "HOLDFAST_SPAWN_TOKEN": token})
    children.append(carrier)
    readers = Readers(workers=1, parked_limit=parked_limit)
    loop = asyncio.get_running_loop()
    taken, release = threading.Event(), threading.Event()

    def other_job() -> None:
        taken.set()
        release.wait(30)

    others: list[asyncio.Task[None]] = []

    class TakeTheFreedThread(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # Said on the loop as the kill's run is given up, before its run again is submitted: a
            # task made now starts first, and its job takes the thread the give-up freed.
            if record.levelno == logging.WARNING and not others:
                others.append(loop.create_task(readers.run(other_job)))

    handler = TakeTheFreedThread()
    logging.getLogger("holdfast.agent.reads").addHandler(handler)
    try:
        with StuckFuse(mountpoint(tmp_path, 0)) as fuse:
            stuck, stick = stuck_when_told(children, fuse, mint_token())
            stopping, stuck_now = threading.Event(), threading.Event()

            def environ(pid: int | str, start_ticks: int | None, proc: str) -> bytes | None:
                if int(pid) not in (carrier.pid, stuck.pid):
                    # Other processes on this host (another test's stuck one among them) are left out.
                    raise PermissionError(errno.EACCES, "none of this test's processes")
                if int(pid) == carrier.pid and start_ticks is None:
                    stopping.set()  # the check of a carrier just before its SIGSTOP (a scan's has ticks)
                if int(pid) == stuck.pid and stopping.is_set() and not stuck_now.is_set():
                    # The scan after the stop: stuck on this read.
                    until("the carrier stopped", lambda: stopped(carrier.pid))
                    stick()
                    stuck_now.set()
                return readers.environ(pid, start_ticks, proc)

            owner = agent_pb2.ProcessIdentity(pid=carrier.pid, spawn_token=token)
            no_cgroups = cgroups.Capability("", 0, False, "this test makes none")
            dropped = REGISTRY.get_sample_value("holdfast_agent_reads_dropped_total") or 0.0
            kill = loop.create_task(readers.run(kill_tree, owner, b"HOLDFAST_SPAWN_TOKEN", False, no_cgroups,
                                                environ, Stopped()))
            assert await asyncio.to_thread(taken.wait, 30), "the kill's run was never given up"
            assert stuck_now.is_set() and stopped(carrier.pid)
            waiting = REGISTRY.get_sample_value("holdfast_agent_reads_waiting")
            assert waiting == 1, "the kill's run again found a thread free"
            kill.cancel()
            with pytest.raises(asyncio.CancelledError):
                await kill
            release.set()
            await others[0]
            try:
                code = await asyncio.to_thread(carrier.wait, 20)
            except subprocess.TimeoutExpired:
                pytest.fail("the carrier the kill stopped stays stopped: its run again was dropped, or "
                            "killed only what it could read")
            assert code == -signal.SIGKILL
            assert (REGISTRY.get_sample_value("holdfast_agent_reads_dropped_total") or 0.0) == dropped
    finally:
        logging.getLogger("holdfast.agent.reads").removeHandler(handler)
