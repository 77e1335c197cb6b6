"""A job whose reads stick and then return is run again a bounded number of times: a process whose
environ reads each stick for STUCK_AFTER_S and then return is not refused once they returned, so
every run again of a job could be given up on it in turn, for ever, holding a reader thread (a few
such KillOwner calls held them all). Its environ here is a FIFO under a stand-in /proc: each open
waits for a writer, which comes once the read is given up."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.agent.kill import Stopped, kill_tree
from holdfast.agent.reads import Readers, ReadRefused
from holdfast.agent.reads_rules import MAX_GIVE_UPS
from holdfast.proc import cgroups
from holdfast.proc.procstat import parse_stat
from holdfast.v1 import agent_pb2
from tests.integration.coordinator_fixtures import run_async

pytestmark = [pytest.mark.timeout(60)]
PID = 4242


class ReleaseWhenGivenUp(logging.Handler):
    """Lets each stuck read return once it is given up (a writer: EOF), and counts its return."""

    def __init__(self, fifo: Path) -> None:
        super().__init__()
        self.fifo = fifo
        self.given_up = 0
        self.returned = threading.Semaphore(0)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:
            self.given_up += 1
            threading.Thread(target=lambda: os.close(os.open(self.fifo, os.O_WRONLY)), daemon=True).start()
        elif "given up as stuck returned" in record.getMessage():
            self.returned.release()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, ReleaseWhenGivenUp]]:
    """A stand-in /proc whose PID's environ is a FIFO, and the handler releasing its reads."""
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    os.mkfifo(proc / str(PID) / "environ")
    handler = ReleaseWhenGivenUp(proc / str(PID) / "environ")
    logger = logging.getLogger("holdfast.agent.reads")
    level = logger.level
    logger.setLevel(logging.INFO)  # the return of a read given up is said at INFO
    logger.addHandler(handler)
    yield proc, handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@run_async
async def test_a_job_given_up_on_reads_that_stick_and_return_ends_unreadable(
        fifo: tuple[Path, ReleaseWhenGivenUp]) -> None:
    proc, handler = fifo
    readers = Readers(workers=1)
    runs: list[int] = []

    def job() -> str:
        runs.append(1)
        if len(runs) > MAX_GIVE_UPS + 1:
            raise AssertionError(f"run {len(runs)}: runs again after a give-up are not bounded")
        if len(runs) > 1:
            # The run given up has returned: its process is no longer refused as pending.
            assert handler.returned.acquire(timeout=20), "the read given up never returned"
        try:
            readers.environ(PID, 1, str(proc))
        except ReadRefused as refused:
            return str(refused)
        return "read"

    answer = await asyncio.wait_for(readers.run(job), 30)
    assert len(runs) == MAX_GIVE_UPS + 1
    assert f"given up {MAX_GIVE_UPS} times" in answer


@run_async
async def test_a_kill_given_up_the_most_times_kills_what_it_stopped(
        fifo: tuple[Path, ReleaseWhenGivenUp], children: list) -> None:  # type: ignore[type-arg]
    """The kill stops the carrier; every read of it after that sticks, then returns once given up.
    Its last run reads nothing, finds no carrier, and kills the one its runs stopped."""
    proc, handler = fifo
    token = "k" * 32
    carrier = subprocess.Popen(["sleep", "300"],
                               env={"PATH": os.environ["PATH"], "HOLDFAST_SPAWN_TOKEN": token})
    children.append(carrier)
    ticks = parse_stat(Path(f"/proc/{carrier.pid}/stat").read_bytes()).start_ticks
    os.symlink(proc / str(PID), proc / str(carrier.pid))
    readers = Readers(workers=1)
    checked = threading.Event()
    waited = 0

    def environ(pid: int | str, start_ticks: int | None, at: str) -> bytes | None:
        nonlocal waited
        if int(pid) != carrier.pid:
            raise PermissionError(errno.EACCES, "none of this test's processes")
        if start_ticks is None:  # the check of the carrier just before its SIGSTOP
            checked.set()
            return readers.environ(pid, start_ticks, at)
        if not checked.is_set():  # the scan that finds it
            return readers.environ(pid, start_ticks, at)
        if handler.given_up > MAX_GIVE_UPS:
            raise AssertionError("runs again after a give-up are not bounded")
        while waited < handler.given_up:  # each read given up has returned: none is refused as pending
            assert handler.returned.acquire(timeout=20), "the read given up never returned"
            waited += 1
        return readers.environ(pid, ticks, str(proc))

    owner = agent_pb2.ProcessIdentity(pid=carrier.pid, spawn_token=token)
    no_cgroups = cgroups.Capability("", 0, False, "this test makes none")
    killed = await asyncio.wait_for(readers.run(kill_tree, owner, b"HOLDFAST_SPAWN_TOKEN", False, no_cgroups,
                                                environ, Stopped()), 30)
    assert handler.given_up == MAX_GIVE_UPS and killed.sent == 1
    assert await asyncio.to_thread(carrier.wait, 20) == -signal.SIGKILL
