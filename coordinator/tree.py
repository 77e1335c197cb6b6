"""A session's child tree on the client's side: its own cgroup v2 where one is writable, and
ending the tree — SIGTERM, a grace period, then SIGKILL (`cgroup.kill` where there is a cgroup).

Guarantee: `end_tree` signals only processes it has just re-checked, through their own pidfd, to
be members of the session's cgroup or carriers of its spawn token (so a reused pid is never hit),
and returns True only when neither the cgroup nor a /proc scan shows a member any more. Waiting
is on pidfds becoming readable, not on a timer. The scan is the agent's (`holdfast.agent.scan`),
so client and agent agree on what "carries the token" means.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import time
from dataclasses import dataclass

from holdfast.agent.environ import read_value
from holdfast.agent.hostinfo import SESSION_CGROUP_PARENT, cgroup2_root
from holdfast.agent.scan import scan

KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class SessionCgroup:
    """`<cgroup2 root>/holdfast/<session>.f<fence>.<random>`: one per gate, created before it runs.

    The random part keeps a name from ever being taken already: a `run` killed with -9 leaves its
    (then empty) cgroup behind, and with the same pid in a fresh namespace and the same fence the
    next `run` would otherwise fail mkdir and lose the cgroup half of the tree proof.
    """

    path: str

    @classmethod
    def create(cls, session_id: str, fence: int) -> SessionCgroup | None:
        """None where no cgroup v2 hierarchy is writable (the tree is then found by its token)."""
        root = cgroup2_root()
        if not root or not os.access(root, os.W_OK):
            return None
        parent = os.path.join(root, SESSION_CGROUP_PARENT)
        path = os.path.join(parent, f"{session_id}.f{fence}.{secrets.token_hex(4)}")
        try:
            os.makedirs(parent, exist_ok=True)
            os.mkdir(path)
        except OSError:
            return None  # read-only or not delegated to us: token carriers remain the tree
        _remove_empty_earlier(parent, session_id, fence)
        return cls(path)

    @property
    def relative(self) -> str:
        """The path as /proc/<pid>/cgroup names it ("0::<relative>")."""
        return "/" + os.path.relpath(self.path, cgroup2_root())

    @property
    def inode(self) -> int:
        return os.stat(self.path).st_ino

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(line) for line in f.read().split()]
        except FileNotFoundError:
            return []

    def populated(self) -> bool:
        try:
            with open(os.path.join(self.path, "cgroup.events")) as f:
                return "populated 1" in f.read()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        with contextlib.suppress(OSError), open(os.path.join(self.path, "cgroup.kill"), "w") as f:
            f.write("1")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def _remove_empty_earlier(parent: str, session_id: str, fence: int) -> None:
    """Drop this session's cgroups of earlier fences that crashed `run`s left behind.

    rmdir of a populated cgroup fails, so a tree still ending keeps its cgroup; an earlier fence's
    grant is superseded by ours, so no `run` of it will add a process to an empty one.
    """
    prefix = f"{session_id}.f"
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            earlier, _, _ = name[len(prefix):].partition(".")
            if name.startswith(prefix) and earlier.isdigit() and int(earlier) < fence:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


@dataclass(frozen=True)
class Tree:
    """What makes a process part of one session's writer: its cgroup, and its spawn token."""

    variable: str
    token: str
    cgroup: SessionCgroup | None = None

    def _member(self, pid: int) -> bool:
        if self.cgroup is not None:
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    if f"0::{self.cgroup.relative}\n" in f.read():
                        return True
            except OSError:
                pass
        try:
            return read_value(pid, self.variable.encode()) == self.token.encode()
        except OSError:
            return False

    def members(self) -> set[int]:
        pids = set(self.cgroup.pids()) if self.cgroup is not None else set()
        pids.update(c.pid for c in scan(self.variable.encode(), self.token.encode()).carriers)
        return pids

    def signal(self, sig: int) -> int:
        """Signals sent, each to a process re-checked as a member through its own pidfd."""
        sent = 0
        for pid in self.members():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if self._member(pid):
                    signal.pidfd_send_signal(fd, sig)
                    sent += 1
            except OSError:
                pass  # exited in between
            finally:
                os.close(fd)
        return sent

    def gone(self) -> bool:
        populated = self.cgroup is not None and self.cgroup.populated()
        return not populated and not self.members()


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


def end_tree(tree: Tree, grace: float) -> bool:
    """SIGTERM the whole tree, give it `grace` seconds, then SIGKILL what is left. True if gone."""
    deadline = time.monotonic() + grace
    tree.signal(signal.SIGTERM)
    while (left := deadline - time.monotonic()) > 0 and not tree.gone():
        # Re-read the members each round: a process may fork while it shuts down.
        wait_exits(tree.members(), left)
    deadline = time.monotonic() + KILL_WAIT_S
    while not tree.gone() and time.monotonic() < deadline:
        if tree.cgroup is not None:
            tree.cgroup.kill()
        tree.signal(signal.SIGKILL)
        wait_exits(tree.members(), min(0.5, max(deadline - time.monotonic(), 0)))
    return tree.gone()
