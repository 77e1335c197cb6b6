"""The public library, sync form: holdfast.client.aio run on a private event loop in a thread of its
own, one loop per Connection. Nothing is decided here; every call is the async one's.

Guarantee: a call interrupted while it waits (a KeyboardInterrupt in the calling thread) cancels the
async work and waits for it to undo what it started — an owner being started ends its gate and
releases its grant — before the interrupt goes on, wherever in the call it lands and whichever
thread the kernel handed the signal to; one landing after a run's start completed ends CMD and
releases, as leaving the block does. With `forward_signals=True`, the signals
`holdfast run` forwards are forwarded to CMD's process group from the calling (main) thread for as
long as the run is in its block, and the handlers before it are put back after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any, TypeVar, Unpack

from holdfast.client.aio import AsyncConnection, AsyncRun, PathLike, RunOptions, spec_of
from holdfast.client.grant import Grant
from holdfast.client.owner import FORWARDED_SIGNALS
from holdfast.client.results import FencedValue, Record

T = TypeVar("T")
# The kernel hands a process-directed signal to any thread that does not block it — the loop's, which
# unblocks signals right after spawning the gate, takes one pending then — and Python runs its handler
# in the main thread only once that thread runs again: a caller asleep on a lock until the work ends
# never raised KeyboardInterrupt (a waiting run went on waiting, its gate left). It wakes this often.
SIGNAL_CHECK_S = 0.1


def wait_released(lock: threading.Lock) -> None:
    """Until the loop releases `lock`, raising in between any exception a signal's handler raises."""
    while not lock.acquire(timeout=SIGNAL_CHECK_S):
        continue


class LoopThread:
    """A private event loop running on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="holdfast-loop", daemon=True)
        self.thread.start()

    def call(self, work: Awaitable[T]) -> T:
        """`work`'s result, run on the loop; interrupted, it is cancelled and waited for first."""
        # A bare lock, not an Event: an Event's Condition takes its lock in Python code, where the
        # interrupt can be raised after the lock was taken and before the `with` that releases it
        # (CPython runs a handler after any call returns), and the loop's `set` then waits for ever.
        ended = threading.Lock()
        ended.acquire()  # released by the loop once the task is done
        started: list[asyncio.Future[T]] = []

        def begin() -> None:
            started.append(asyncio.ensure_future(work, loop=self.loop))
            started[0].add_done_callback(lambda _task: ended.release())

        def cancel() -> None:
            # The loop runs callbacks in the order queued: `begin` has run unless the interrupt came
            # before it was queued, and then the work is begun here only to be cancelled before its
            # first step.
            if not started:
                begin()
            started[0].cancel()

        try:
            self.loop.call_soon_threadsafe(begin)
            wait_released(ended)
        except BaseException:
            self.loop.call_soon_threadsafe(cancel)
            # An interrupt that came once `ended` was taken finds the task done (its done callback
            # releases it only then): waiting again would never end.
            if not (started and started[0].done()):
                wait_released(ended)
            raise
        return started[0].result()

    def iterate(self, stream: AsyncIterator[T]) -> Iterator[T]:
        """`stream`'s items, each fetched on the loop; closing the iterator closes the stream."""
        try:
            while True:
                try:
                    yield self.call(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                self.call(close())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def opened(address: str | None, host_id: str | None, tls_dir: PathLike | None) -> AsyncConnection:
    return AsyncConnection(address, host_id=host_id, tls_dir=tls_dir)  # its channel belongs to this loop


class Connection:
    """One channel to a coordinator, the sync form of AsyncConnection (same arguments, same calls)."""

    def __init__(self, address: str | None = None, *, host_id: str | None = None,
                 tls_dir: PathLike | None = None) -> None:
        self.loop = LoopThread()
        try:
            self.connection = self.loop.call(opened(address, host_id, tls_dir))
        except BaseException:
            self.loop.close()
            raise

    @property
    def address(self) -> str:
        """The coordinator's address this connection calls."""
        return self.connection.address

    @property
    def host_id(self) -> str:
        """The host id this connection acquires as (the one its agent registered)."""
        return self.connection.host_id

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel and ends the connection's event loop thread."""
        try:
            self.loop.call(self.connection.close())
        finally:
            self.loop.close()

    def session(self, session_id: str, argv: Sequence[str], **options: Unpack[RunOptions]) -> Run:
        """A run of CMD (`argv`) as the session's writer, on this connection: `with` it."""
        return Run(self, self.connection.session(session_id, argv, **options))

    def record(self, session_id: str) -> Record | None:
        """The session's record, None when it has none."""
        return self.loop.call(self.connection.record(session_id))

    def get(self, session_id: str, key: str) -> FencedValue:
        """A fenced key of the session, as last written by any of its owners."""
        return self.loop.call(self.connection.get(session_id, key))

    def put(self, grant: Grant, key: str, value: bytes) -> int:
        """Writes `key` under `grant`; the etcd revision. StaleFence once the session moved past it."""
        return self.loop.call(self.connection.put(grant, key, value))

    def record_handle(self, grant: Grant, handle: str) -> Record:
        """Appends the provider's handle (what the next owner resumes) under `grant`; the record."""
        return self.loop.call(self.connection.record_handle(grant, handle))

    def watch(self, session_id: str, grant: Grant | None = None) -> Iterator[Record]:
        """The session's record now, then at every change; close the iterator to stop."""
        return self.loop.iterate(self.connection.watch(session_id, grant))


class Run:
    """CMD run as a session's single writer, the sync form of AsyncRun: `with` starts it and, leaving,
    ends CMD's tree if it still runs and releases the grant; an exception in the block is re-raised."""

    def __init__(self, connection: Connection, run: AsyncRun, owns_connection: bool = False) -> None:
        self.connection, self.run, self.owns_connection = connection, run, owns_connection
        # The loop's thread cannot take signals (asyncio's handlers are the main thread's): forwarded
        # from the caller's thread instead.
        self.forward_signals, run.forward_signals = run.forward_signals, False
        self.saved: dict[int, Any] = {}  # the handlers before forward_signals installed its own

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            self.connection.loop.call(self.run.__aexit__(kind, error, traceback))
        finally:
            self._restore_signals()
            if self.owns_connection:
                self.connection.close()

    def start(self) -> Run:
        """Acquires as the options say and starts CMD; raises the refusal's typed ClientError. It is
        `with`'s __enter__, returning this run from inside its own `try`: `with` calls __exit__ only
        once __enter__ has returned, and an interrupt landing after CMD started but before then would
        leave CMD running and the session held with nobody to end them."""
        try:
            self.connection.loop.call(self.run.start())
            if self.forward_signals:
                for sig in FORWARDED_SIGNALS:
                    self.saved[sig] = signal.signal(sig, self._forward)
            return self
        except BaseException as error:
            # CMD started (an interrupt once the start completed, or the handlers refused: not the
            # main thread, and the run does not go on unforwarded): ended as leaving the block ends it.
            if self.run.supervisor is not None:
                self.__exit__(type(error), error, error.__traceback__)
            elif self.owns_connection:
                self.connection.close()
            raise

    __enter__ = start

    def _forward(self, sig: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.run.pid, sig)

    def _restore_signals(self) -> None:
        while self.saved:
            sig, handler = self.saved.popitem()
            signal.signal(sig, handler)

    def wait(self) -> int:
        """Until CMD has ended and the grant is released: CMD's status as a shell reports it."""
        ended = self.run.status  # after the block, whose exit closed a connection of the run's own
        return ended if ended is not None else self.connection.loop.call(self.run.wait())

    def stop(self) -> int:
        """Ends CMD's tree if it still runs (SIGTERM, `grace`, SIGKILL), then as `wait`."""
        ended = self.run.status
        return ended if ended is not None else self.connection.loop.call(self.run.stop())

    @property
    def session_id(self) -> str:
        """The session this run is the writer of."""
        return self.run.session_id

    @property
    def grant(self) -> Grant:
        """The grant every fenced write of this run carries (its secret is never printed)."""
        return self.run.grant

    @property
    def fence(self) -> int:
        """The grant's fence: every write under it is refused once the session has moved past it."""
        return self.run.fence

    @property
    def pid(self) -> int:
        """CMD's pid: the leader of CMD's process group."""
        return self.run.pid

    @property
    def record(self) -> Record:
        """The session's record as committed to CMD: `record.resume_handle` is what CMD resumes."""
        return self.run.record

    @property
    def running(self) -> bool:
        """Whether CMD's tree has yet to end and the grant to be released."""
        return self.run.running

    @property
    def status(self) -> int | None:
        """CMD's status once it has ended and the grant was released; None before."""
        return self.run.status

    @property
    def ended_by(self) -> str:
        """"handoff", "lost" or "" (AsyncRun.ended_by)."""
        return self.run.ended_by

    def put(self, key: str, value: bytes) -> int:
        """A fenced write under this run's grant: StaleFence once the session has moved on."""
        return self.connection.put(self.grant, key, value)

    def get(self, key: str) -> FencedValue:
        """The session's fenced `key`, as last written by any of its owners."""
        return self.connection.get(self.session_id, key)

    def record_handle(self, handle: str) -> Record:
        """Records the provider's handle under this run's grant (what the next owner resumes)."""
        return self.connection.record_handle(self.grant, handle)

    def watch(self) -> Iterator[Record]:
        """The session's record now and at every change, checked to come from the grant's cluster."""
        return self.connection.watch(self.session_id, self.grant)


def session(session_id: str, argv: Sequence[str], *, address: str | None = None, host_id: str | None = None,
            tls_dir: PathLike | None = None, **options: Unpack[RunOptions]) -> Run:
    """A run of CMD as the session's writer on a connection of its own, closed with it:
    `with session("S", ["codex", "exec", PROMPT], takeover=True) as run: ...`."""
    spec_of(session_id, argv, options)  # a bad argument starts no thread
    connection = Connection(address, host_id=host_id, tls_dir=tls_dir)
    try:
        return Run(connection, connection.connection.session(session_id, argv, **options),
                   owns_connection=True)
    except BaseException:
        connection.close()
        raise
