"""The agent's work that reads other processes' memory, run off the event loop on reader threads.

Guarantee: every read of another process's environ the agent makes goes through `Readers.environ`
on a reader thread, in a job `Readers.run` awaits, so the event loop (heartbeats, exit watches,
every other call) never waits on one. A job whose thread has been in one read for STUCK_AFTER_S is
given up and run again on another thread, where that process is refused (agent/reads_rules.py):
the answer is as for an unreadable environ. A job is run again at most MAX_GIVE_UPS times
(agent/reads_rules.py): that last run is refused every read, so it ends, answered as unreadable.
The given-up thread stays parked until its read returns, then ends at once (`Abandoned`), so no
job ever runs twice at the same time and nothing it would have done after the read is done.
Reader threads are at most MAX_WORKERS, besides the parked ones. A job waits for a thread when
all are busy; one whose caller went away meanwhile (its RPC's deadline passed, or the call was
cancelled) never runs: a kill or an attestation its caller already answered as failed or unknown
is not done after the answer. A job a thread has taken runs to its end whether or not its caller
still waits, every run of it again after a give-up included: that run finishes what the one given
up started (a kill kills the carriers it stopped, its last run without reading them). Work that
may need no environ at all is first tried on the loop with `on_loop` as its reader, which reads
nothing: at its first read it raises `OnLoop`, and the work starts over as a job.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from holdfast.agent import metrics, reads_rules
from holdfast.agent.reads_rules import Identity
from holdfast.proc.environ import read_environ, read_proc_file
from holdfast.proc.procstat import StatParseError, parse_stat

log = logging.getLogger("holdfast.agent.reads")
T = TypeVar("T")
# Jobs at once: a scan may take up to a second on a churning host, and others' probes must not
# queue behind it.
MAX_WORKERS = 8


class ReadRefused(OSError):
    """A read not started: its process's read is pending, or too many are (unreadable, as EAGAIN)."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.EAGAIN, why)


class Abandoned(BaseException):
    """Raised in a parked thread when its read returns: its job was given up and runs elsewhere.
    Not an Exception, so no handler of a job's failures takes it for one."""


class OnLoop(BaseException):
    """Work tried on the event loop needs another process's memory: it starts over as a job. Not an
    Exception, so no handler of unreadable environs takes it for one."""


def on_loop(pid: int | str, start_ticks: int | None, proc: str) -> NoReturn:
    """The environ reader of work on the event loop: reads nothing (`OnLoop`)."""
    raise OnLoop


class _GivenUp(Exception):
    """A job's thread is stuck in a read: the job is run again."""


class _Worker:
    __slots__ = ("abandoned", "current", "job", "jobs")

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.job: _Job | None = None  # the job it runs now
        self.current: tuple[Identity, float] | None = None  # the read under way, since when
        self.abandoned = False


class _Job:
    __slots__ = ("args", "done", "dropped", "fn", "given_up", "loop", "timer", "worker")

    def __init__(self, fn: Callable[..., Any], args: tuple[object, ...],
                 loop: asyncio.AbstractEventLoop, given_up: int = 0) -> None:
        self.fn, self.args, self.loop = fn, args, loop
        self.given_up = given_up  # runs of this job given up before this one
        self.done: asyncio.Future[Any] = loop.create_future()
        self.worker: _Worker | None = None  # the thread that took it (set under `Readers._lock`)
        self.timer: asyncio.TimerHandle | None = None
        self.dropped = False  # its caller went away before a thread took it (under `Readers._lock`)


def _settle(done: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if done.done():
        return  # given up meanwhile, or its caller went away
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


class Readers:
    def __init__(self, workers: int = MAX_WORKERS, parked_limit: int = reads_rules.MAX_PARKED) -> None:
        self._workers = workers
        self._lock = threading.Lock()
        self._parked = reads_rules.Parked(parked_limit)
        self._idle: list[_Worker] = []
        self._backlog: collections.deque[_Job] = collections.deque()
        self._live = 0
        self._local = threading.local()

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on a reader thread; run again on another while its thread is stuck in a read.
        Its caller going away drops it only while no thread has taken it."""
        loop = asyncio.get_running_loop()
        first = _Job(fn, args, loop)
        self._submit(first)
        through = loop.create_task(self._through(first))
        try:
            return await asyncio.shield(through)
        except asyncio.CancelledError:
            if self._drop(first):
                first.done.cancel()  # `through` ends, and with it the stuck-checks of a job never run
            raise

    async def _through(self, job: _Job) -> Any:
        """The job's answer, run again as a new job each time it is given up, until one run ends. A
        run again is never dropped, whether or not the caller still waits: the run given up may have
        started what only it finishes (a kill that stopped carriers, with SIGKILL still to send)."""
        try:
            while True:
                try:
                    return await job.done
                except _GivenUp:
                    job = _Job(job.fn, job.args, job.loop, job.given_up + 1)
                    self._submit(job)
        finally:
            if job.timer is not None:
                job.timer.cancel()

    def _drop(self, job: _Job) -> bool:
        """Whether the job is dropped: its caller went away (the RPC's deadline passed, or it was
        cancelled) while it waited, and no thread takes it. Else a kill, or an attestation's move of
        a process into a session cgroup, would land after the caller had answered OWNERSHIP_UNKNOWN
        or ATTESTATION_FAILED. A job already taken runs to its end."""
        with self._lock:
            if job.worker is not None:
                return False
            job.dropped = True
            with contextlib.suppress(ValueError):  # not in the backlog: handed to a thread not yet at it
                self._backlog.remove(job)
            waiting = len(self._backlog)
            metrics.READS_WAITING.set(waiting)
        metrics.READS_DROPPED.inc()
        log.info("a job waiting for a reader thread was dropped: its caller went away before a thread "
                 "was free", extra={"fields": {"job": getattr(job.fn, "__name__", "?"), "waiting": waiting}})
        return True

    def _submit(self, job: _Job) -> None:
        job.timer = job.loop.call_later(reads_rules.STUCK_AFTER_S, self._check, job)
        with self._lock:
            if self._idle:
                self._idle.pop().jobs.put(job)
                return
            if self._live >= self._workers:
                self._backlog.append(job)
                metrics.READS_WAITING.set(len(self._backlog))
                return
            self._live += 1
        worker = _Worker()
        worker.jobs.put(job)
        threading.Thread(target=self._serve, args=(worker,), name="holdfast-reads", daemon=True).start()

    def _serve(self, worker: _Worker) -> None:
        self._local.worker = worker
        while True:
            job = worker.jobs.get()
            with self._lock:
                # Taken under the lock `_drop` holds: a job its caller gave up on never starts, and
                # one started is never dropped.
                taken = not job.dropped
                if taken:
                    job.worker, worker.job = worker, job
            if not taken:
                self._next(worker)
                continue
            try:
                result, error = job.fn(*job.args), None
            except Abandoned:
                return
            except BaseException as exc:  # handed to the caller awaiting the job
                result, error = None, exc
            # Idle (or given the next job waiting) before the answer is posted: the loop may hand
            # out its next job the moment it has it, and must find this thread free for it.
            self._next(worker)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody awaits the job
                job.loop.call_soon_threadsafe(_settle, job.done, result, error)

    def _next(self, worker: _Worker) -> None:
        """The worker is given the next job waiting, or goes idle."""
        with self._lock:
            if self._backlog:
                worker.jobs.put(self._backlog.popleft())
            else:
                self._idle.append(worker)
            metrics.READS_WAITING.set(len(self._backlog))

    def _check(self, job: _Job) -> None:
        """On the loop, every so often while a job runs: time asks whether its read is stuck; a read
        under way for STUCK_AFTER_S answers yes, and the job is given up (never answered by time)."""
        if job.done.done():
            return
        now = time.monotonic()
        with self._lock:
            worker = job.worker
            # The read under way is this job's only while its thread still runs it.
            current = worker.current if worker is not None and worker.job is job else None
            if worker is None or current is None or not reads_rules.stuck(current[1], now):
                started = current[1] if current is not None else None
                job.timer = job.loop.call_later(reads_rules.recheck_in(started, now), self._check, job)
                return
            worker.abandoned = True
            parked = current[0]
            self._parked.park(parked)
            self._live -= 1
            total = self._parked.total
        metrics.READS_PARKED.set(total)
        log.warning("a read of another process's memory is stuck: it reads as unreadable while the read "
                    "is pending, and scans meeting it are incomplete",
                    extra={"fields": {"pid": parked[0], "start_ticks": parked[1], "parked": total}})
        job.done.set_exception(_GivenUp())

    def environ(self, pid: int | str, start_ticks: int | None, proc: str) -> bytes | None:
        """`read_environ`, on a reader thread, unless the process is refused (`ReadRefused`); raises
        `Abandoned` when the read returns after its job was given up. Without `start_ticks` the
        process's stat is read first: the identity a stuck read is remembered by."""
        if start_ticks is None:
            try:
                start_ticks = parse_stat(read_proc_file(f"{proc}/{pid}/stat")).start_ticks
            except StatParseError as exc:
                raise ReadRefused(f"/proc/{pid}/stat unparsable: {exc}") from exc
        who = (int(pid), start_ticks)
        worker: _Worker = self._local.worker
        with self._lock:
            why = self._parked.refusal(who, worker.job.given_up if worker.job is not None else 0)
            if not why:
                worker.current = (who, time.monotonic())
        if why:
            metrics.READS_REFUSED.inc()
            raise ReadRefused(why)
        try:
            block = read_environ(pid, proc)
        finally:
            self._finish(worker, who)
        return block

    def _finish(self, worker: _Worker, who: Identity) -> None:
        with self._lock:
            worker.current = None
            if worker.abandoned:
                self._parked.unpark(who)
            total = self._parked.total
        if worker.abandoned:
            metrics.READS_PARKED.set(total)
            log.info("a read given up as stuck returned", extra={"fields": {"pid": who[0], "parked": total}})
            raise Abandoned
