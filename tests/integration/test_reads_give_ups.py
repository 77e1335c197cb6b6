"""A job whose reads stick and then return is run again a bounded number of times: a process whose
environ reads each stick for STUCK_AFTER_S and then return is not refused once they returned, so
every run again of a job could be given up on it in turn, for ever, holding a reader thread (a few
such KillOwner calls held them all). Its environ here is a FIFO under a stand-in /proc: each open
waits for a writer, which comes once the read is given up."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from holdfast.agent.reads import Readers, ReadRefused
from holdfast.agent.reads_rules import MAX_GIVE_UPS
from tests.integration.coordinator_fixtures import run_async

pytestmark = [pytest.mark.timeout(60)]
PID = 4242


class ReleaseWhenGivenUp(logging.Handler):
    """Lets each stuck read return once it is given up, and says when it has returned."""

    def __init__(self, fifo: Path) -> None:
        super().__init__()
        self.fifo = fifo
        self.returned = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:  # given up: a writer ends the read (EOF)
            threading.Thread(target=lambda: os.close(os.open(self.fifo, os.O_WRONLY)), daemon=True).start()
        elif "given up as stuck returned" in record.getMessage():
            self.returned.set()


@run_async
async def test_a_job_given_up_on_reads_that_stick_and_return_ends_unreadable(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    fifo = proc / str(PID) / "environ"
    os.mkfifo(fifo)
    readers = Readers(workers=1)
    handler = ReleaseWhenGivenUp(fifo)
    runs: list[int] = []

    def job() -> str:
        runs.append(1)
        if len(runs) > MAX_GIVE_UPS + 1:
            raise AssertionError(f"run {len(runs)}: runs again after a give-up are not bounded")
        if len(runs) > 1:
            # The run given up has returned: its process is no longer refused as pending.
            assert handler.returned.wait(20), "the read given up never returned"
            handler.returned.clear()
        try:
            readers.environ(PID, 1, str(proc))
        except ReadRefused as refused:
            return str(refused)
        return "read"

    logger = logging.getLogger("holdfast.agent.reads")
    level = logger.level
    logger.setLevel(logging.INFO)  # the return of a read given up is said at INFO
    logger.addHandler(handler)
    try:
        answer = await asyncio.wait_for(readers.run(job), 30)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert len(runs) == MAX_GIVE_UPS + 1
    assert f"given up {MAX_GIVE_UPS} times" in answer
