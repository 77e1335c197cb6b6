"""A session's child tree on the client's side, and ending it: SIGTERM, a grace period, then stop
everything and kill it (`cgroup.kill` too where this process may write it).

The session cgroup is the agent's (made at attestation, whatever this process's privileges); the
client finds it as the gate's own cgroup in its own view of the hierarchy, so it is never named by
anyone else. Guarantee: `end_tree` signals only processes it has just re-checked, through their
own pidfd, to be members of that cgroup (or of one nested in it: a `holdfast run` inside CMD gets
its own session cgroup there, and its tree carries its own token, so it is of this tree by its cgroup
alone) or carriers of the spawn token (so a reused pid is never hit), and returns True only when the
cgroup is empty and a stable scan shows no carrier. Before the
final kill every member is stopped, until a round finds none new: a tree that keeps forking cannot
outrun it. Waiting is on pidfds becoming readable, not on a timer. The scan is the agent's
(`holdfast.proc.scan`), with the agent's bound (no process older than the gate is of its tree),
so client and agent agree on what "carries the token" means; the agent, not this, proves the tree
gone before a Release is accepted.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from holdfast.proc.cgroups import cgroup2_root, is_session_cgroup
from holdfast.proc.ending import KILL_WAIT_S, stop_until_stable
from holdfast.proc.environ import read_proc_file, read_value
from holdfast.proc.procstat import StatParseError, parse_stat

if TYPE_CHECKING:
    from holdfast.proc.scan import Scan


# Cgroups read per listing of a tree's members; each holds a descriptor until read.
MAX_CGROUPS = 512
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _cgroup_line(pid: int) -> str | None:
    try:
        text = read_proc_file(f"/proc/{pid}/cgroup").decode(errors="replace")
    except OSError:
        return None
    return next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)


def _procs(directory: int) -> set[int]:
    try:
        fd = os.open("cgroup.procs", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return set()
    try:
        with open(fd, closefd=False) as f:
            return {int(line) for line in f.read().split()}
    except (OSError, ValueError):
        return set()
    finally:
        os.close(fd)


def _subtree_procs(path: str) -> set[int]:
    """The pids in the cgroup at `path` and in the cgroups under it, at most MAX_CGROUPS of them (the
    rest are missed here, and `populated` still sees them). Each is opened through its parent's
    descriptor, never by a path followed again; one removed meanwhile held none."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        pending = [os.open(path, _OPEN_DIR)]
        read = 0
        try:
            while pending:
                directory = pending.pop()
                try:
                    pids |= _procs(directory)
                    read += 1
                    with os.scandir(directory) as entries:
                        names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                    for name in names:
                        if read + len(pending) >= MAX_CGROUPS:
                            break
                        with contextlib.suppress(OSError):
                            pending.append(os.open(name, _OPEN_DIR, dir_fd=directory))
                except OSError:
                    pass  # removed while read
                finally:
                    os.close(directory)
        finally:
            for fd in pending:
                os.close(fd)
    return pids


@dataclass(frozen=True)
class Tree:
    """What makes a process part of one session's writer: its cgroup, and its spawn token."""

    variable: str
    token: str
    cgroup: str = ""  # absolute, in this process's view; "" when the agent made none
    relative: str = ""  # as /proc/<pid>/cgroup names it here ("0::<relative>")
    born_since: int = 0  # the gate's start ticks: every member is born at or after them (0: unknown)

    @classmethod
    def of_gate(cls, variable: str, token: str, gate_pid: int) -> Tree:
        """The tree of a gate the agent has attested (and so moved into its session cgroup)."""
        root, relative = cgroup2_root(), _cgroup_line(gate_pid)
        try:
            born_since = parse_stat(read_proc_file(f"/proc/{gate_pid}/stat")).start_ticks
        except (OSError, StatParseError):
            born_since = 0
        if root and relative and relative.startswith("/"):
            path = os.path.normpath(root + relative)
            if is_session_cgroup(path, root):
                return cls(variable, token, path, relative, born_since)
        return cls(variable, token, born_since=born_since)

    def _scan(self) -> Scan:
        # Loaded at the first scan, at the tree's end: as an import it was ~1.5 ms of every start.
        from holdfast.proc.scan import scan

        return scan(self.variable.encode(), self.token.encode(), born_since=self.born_since)

    def _member(self, pid: int) -> bool:
        # A cgroup nested in the session's is of the tree: a `holdfast run` inside CMD gets one.
        line = _cgroup_line(pid)
        if self.relative and line is not None and (line == self.relative or
                                                   line.startswith(self.relative.rstrip("/") + "/")):
            return True
        try:
            return read_value(pid, self.variable.encode()) == self.token.encode()
        except OSError:
            return False

    def cgroup_members(self) -> set[int]:
        """The processes of the session cgroup and of every cgroup nested in it (none without one):
        a `holdfast run` inside CMD has its own session cgroup under this one, and its tree is of
        this tree too. No scan."""
        return _subtree_procs(self.cgroup) if self.cgroup else set()

    def members(self) -> set[int]:
        pids = self.cgroup_members()
        pids.update(c.pid for c in self._scan().carriers)
        return pids

    def signal(self, sig: int, pids: set[int] | None = None) -> set[int]:
        """The pids signalled, each re-checked as a member through its own pidfd."""
        sent = set()
        for pid in self.members() if pids is None else pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if self._member(pid):
                    signal.pidfd_send_signal(fd, sig)
                    sent.add(pid)
            except OSError:
                pass  # exited in between
            finally:
                os.close(fd)
        return sent

    def populated(self) -> bool:
        if not self.cgroup:
            return False
        try:
            with open(os.path.join(self.cgroup, "cgroup.events")) as f:
                return "populated 1" in f.read()
        except FileNotFoundError:
            return False  # removed: rmdir succeeds only on an empty cgroup
        except OSError:
            return True  # cannot tell: not gone

    def kill_cgroup(self) -> None:
        """cgroup.kill, where this process may write it (the agent made it: usually only root may)."""
        if self.cgroup:
            with contextlib.suppress(OSError), open(os.path.join(self.cgroup, "cgroup.kill"), "w") as f:
                f.write("1")

    def gone(self) -> bool:
        if self.populated():
            return False
        found = self._scan()
        return found.stable and not found.carriers


def left_of(tree: Tree) -> str:
    """What is left of a tree `end_tree` could not end, each said once: the members it signalled
    that still live, and those it could not signal, with why (a pid not re-checkable as a member is
    never signalled)."""
    live: list[int] = []
    unsignalled: list[str] = []
    for pid in sorted(tree.members()):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # exited meanwhile
        try:
            if not tree._member(pid):
                unsignalled.append(f"{pid} (its membership could not be re-read)")
                continue
            signal.pidfd_send_signal(fd, 0)  # a permission check: end_tree sent this pid SIGKILL
            live.append(pid)
        except PermissionError:
            unsignalled.append(f"{pid} (not permitted: another user's)")
        except OSError:
            pass  # exited meanwhile
        finally:
            os.close(fd)
    parts = [f"signalled and still live: {' '.join(map(str, live))}"] if live else []
    if unsignalled:
        parts.append(f"could not be signalled: {', '.join(unsignalled)}")
    if not parts:
        parts.append("its cgroup still populated or its scan unsettled, by no process this run can list")
    return "; ".join(parts)


def wait_exits(pids: set[int], timeout: float) -> None:
    """Returns once every pid has exited (its pidfd polls readable) or `timeout` passed."""
    fds = []
    for pid in pids:
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(pid))
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        pending = len(fds)
        deadline = time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in fds:
            os.close(fd)


def stop_all(tree: Tree) -> set[int]:
    """SIGSTOP every member until a round finds none not yet stopped; a stopped process forks nothing."""

    def stop(new: set[int]) -> set[int]:
        tree.signal(signal.SIGSTOP, new)
        return new  # stopped, or gone, or no member after all: none needs a second look

    return stop_until_stable(lambda: (tree.members(), True), stop)


def end_tree(tree: Tree, grace: float, termed: Set[int] = frozenset()) -> bool:
    """SIGTERM the whole tree (but the pids in `termed`, sent it already), give it `grace` seconds,
    then stop and SIGKILL what is left. True if gone."""
    deadline = time.monotonic() + grace
    tree.signal(signal.SIGTERM, tree.members() - termed)
    while (left := deadline - time.monotonic()) > 0 and not tree.gone():
        # Re-read the members each round: a process may fork while it shuts down.
        wait_exits(tree.members(), left)
    deadline = time.monotonic() + KILL_WAIT_S
    while not tree.gone() and time.monotonic() < deadline:
        tree.kill_cgroup()
        stopped = stop_all(tree)
        tree.signal(signal.SIGKILL, stopped | tree.members())
        wait_exits(tree.members(), min(0.5, max(deadline - time.monotonic(), 0)))
    return tree.gone()
