"""The start ticks of processes a scan has read, each kept with a pidfd of that very process, so a
later scan learns an old process's age without reading its stat again.

A scan for trees rooted at or after some tick (`born_since`, proc/scan.py) reads no environ of an
older process, but it still read the stat of every process to learn its age: among 1,000 live
owners that was 20 ms of every proof. A process's start ticks never change while it lives, and a
pidfd says whether it still does.

Guarantee: `alive()` returns a pid's ticks only if the process they were read from had not exited
when `alive()` polled its pidfd. A scan calls it after listing /proc, so a process alive then held
its pid from before the listing through the poll: the listed pid is that process, and the ticks
are its own. The pidfd is opened *before* the stat is read (`opened`, then `learn`): if the
process exits in between and its pid is taken by a newcomer, the pidfd is of the exited one, polls
readable, and the entry is dropped before any use. Opened after the read, it could be the
newcomer's, and would vouch for the newcomer's age with the old process's ticks — a young tree
member taken for an old bystander and never read. Only ages are kept: an environ can change under
a live process, so it is read afresh every time.

Pids are this process's pid namespace's, so a scan uses this only on its own namespace's /proc.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading


class ProcessAges:
    """pid → start ticks of processes seen alive, for as long as each lives; thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # pidfds held at most: past it, processes are read as if never seen
        self._lock = threading.Lock()
        self._ticks: dict[int, int] = {}
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self._pids: dict[int, int] = {}  # pidfd -> pid
        self._ready = select.epoll()

    def alive(self) -> dict[int, int]:
        """pid → start ticks of every known process that has not exited as of this call. Call it
        after listing /proc, never before: see the module's guarantee."""
        with self._lock:
            for fd, _ in self._ready.poll(0):
                self._drop(self._pids[fd])
            return dict(self._ticks)

    def opened(self, pid: int) -> int | None:
        """A pidfd of `pid` to learn its age with, opened before its stat is read; None when it is
        known already, the limit is reached, or it is gone."""
        if pid in self._fds or len(self._fds) >= self.limit:
            return None
        try:
            return os.pidfd_open(pid)
        except OSError:
            return None

    def learn(self, pid: int, pidfd: int, start_ticks: int) -> None:
        """Keeps the ticks read after `pidfd` (from `opened`) was opened; takes the pidfd."""
        with self._lock:
            if pid in self._fds:
                os.close(pidfd)  # learned meanwhile by another scan's pass
                return
            self._fds[pid], self._pids[pidfd], self._ticks[pid] = pidfd, pid, start_ticks
            self._ready.register(pidfd, select.EPOLLIN)

    def forget(self, pidfd: int) -> None:
        """A pidfd from `opened` whose stat was not read."""
        os.close(pidfd)

    def _drop(self, pid: int) -> None:
        fd = self._fds.pop(pid)
        del self._pids[fd], self._ticks[pid]
        with contextlib.suppress(OSError):
            self._ready.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        with self._lock:
            for pid in list(self._fds):
                self._drop(pid)
            self._ready.close()
