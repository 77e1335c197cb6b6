"""Ending an owner tree, only after its identity is proven.

Guarantee: every signal goes through a pidfd that was checked, after it was opened, to name the
process meant — the root by its recorded start ticks (and pidfs inode where there is one), a
carrier by the token in its environ — and that had not exited when checked, so a reused pid is
never hit (without pidfs an inode of 0 says nothing: the check is start ticks through the pidfd).
The session cgroup is ended with `cgroup.kill`, which the kernel applies to forks racing it. A
token carrier outside the cgroup is first stopped, every carrier until a stable scan finds no new
one, and only then killed: a tree that keeps forking cannot outrun a kill that stops it first.
Every carrier a kill stopped is killed by the run of it that ends (`Stopped`): one given up on a
stuck read leaves them to its next run, which kills them without reading them again, and one that
fails kills them on its way out. A signal the kernel refuses (EPERM) is never read as the
process's exit: it is reported refused.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from holdfast.agent.observe import pidfd_exited
from holdfast.agent.reads import Abandoned
from holdfast.proc import cgroups
from holdfast.proc.ending import stop_until_stable
from holdfast.proc.environ import EnvironReader, read_proc_file, read_value
from holdfast.proc.procstat import StatParseError, parse_stat
from holdfast.proc.scan import scan
from holdfast.v1 import agent_pb2

STOP_SECONDS = 3.0


def _open_root(identity: agent_pb2.ProcessIdentity) -> int | None:
    """A pidfd for the recorded root, or None when the pid now names another process (or none)."""
    try:
        fd = os.pidfd_open(identity.pid)
    except OSError:
        return None
    try:
        if identity.pidfd_ino and os.fstat(fd).st_ino != identity.pidfd_ino:
            raise LookupError
        ticks = parse_stat(read_proc_file(f"/proc/{identity.pid}/stat")).start_ticks
        # Read after the open and before this poll: /proc named the pidfd's process at that time.
        if ticks != identity.start_ticks or pidfd_exited(fd):
            raise LookupError
    except (OSError, StatParseError, LookupError):
        os.close(fd)
        return None
    return fd


def _open_carrier(pid: int, variable: bytes, token: bytes, environ: EnvironReader) -> int | None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        carries = read_value(pid, variable, environ) == token
    except OSError:
        carries = False
    except BaseException:  # the job given up while stuck on a read (agent/reads.py): it runs again
        os.close(fd)
        raise
    if not carries or pidfd_exited(fd):
        os.close(fd)
        return None
    return fd


@dataclass(frozen=True)
class Killed:
    sent: int  # SIGKILLs delivered (and a cgroup.kill written)
    refused: tuple[str, ...]  # each signal the kernel refused: "pid N (SIGSTOP): why"


def _send(fd: int, pid: int, sig: int, refused: set[str]) -> bool:
    """Whether `sig` went through the checked pidfd. ESRCH: the process exited since it was checked.
    Any other failure (EPERM: another uid's process and no CAP_KILL, or an LSM's denial) says
    nothing of its end — it is no exit, and it is kept in `refused` to be said."""
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    except OSError as exc:
        refused.add(f"pid {pid} ({signal.Signals(sig).name}): {exc.strerror}")
        return False
    return True


class Stopped:
    """The carriers one kill has stopped, by pid, with their checked pidfds, across its runs. A run
    given up on a stuck read (agent/reads.py) leaves them here for the kill's next run, which kills
    them without reading them again: a stopped carrier whose environ can no longer be read (refused
    while reads are stuck) is killed all the same, never left stopped. One run at a time uses it: a
    run given up does nothing more once its read returns (`Abandoned`)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def holds(self, pid: int) -> bool:
        """Whether `pid` is a process this kill stopped, and still the same one (not exited)."""
        fd = self._fds.get(pid)
        if fd is not None and pidfd_exited(fd):
            os.close(self._fds.pop(pid))  # exited: its pid may name a new carrier, not stopped
            return False
        return fd is not None

    def add(self, pid: int, fd: int) -> None:
        self._fds[pid] = fd

    def kill(self, refused: set[str]) -> int:
        """SIGKILLs delivered to every process stopped, each through its pidfd, then closed."""
        sent = 0
        while self._fds:
            pid, fd = self._fds.popitem()
            try:
                sent += _send(fd, pid, signal.SIGKILL, refused)
            finally:
                os.close(fd)
        return sent


def stop_carriers(variable: bytes, token: bytes, environ: EnvironReader, refused: set[str],
                  stopped: Stopped, skip: int = 0) -> None:
    """SIGSTOP every carrier of the token until a stable scan shows none that is not stopped, each
    kept in `stopped` (the caller kills them). Every environ is read through `environ`: one that
    cannot be read is no carrier proven, and is not signalled. A stop the kernel refused is added
    to `refused`."""

    def carriers() -> tuple[list[int], bool]:
        found = scan(variable, token, environ=environ)
        return [c.pid for c in found.carriers if c.pid != skip], found.stable

    def stop(new: set[int]) -> list[int]:
        for pid in new:
            if stopped.holds(pid):
                continue  # stopped by this kill's run given up
            fd = _open_carrier(pid, variable, token, environ)
            if fd is not None and _send(fd, pid, signal.SIGSTOP, refused):
                stopped.add(pid, fd)
            elif fd is not None:
                os.close(fd)
        return [pid for pid in new if stopped.holds(pid)]  # one not stopped is looked at again

    stop_until_stable(carriers, stop, STOP_SECONDS)


def kill_tree(identity: agent_pb2.ProcessIdentity, variable: bytes, root_matched: bool,
              cap: cgroups.Capability, environ: EnvironReader, stopped: Stopped) -> Killed:
    """The signals sent, and those refused. The root is signalled only when just judged
    IDENTITY_MATCHED and re-checked through its pidfd; the cgroup and the carriers whenever the root
    is matched or proven dead, since descendants outlive their root. `stopped`: one for the kill,
    passed to each of its runs."""
    sent = 0
    refused: set[str] = set()
    if root_matched and (fd := _open_root(identity)) is not None:
        try:
            sent += _send(fd, identity.pid, signal.SIGKILL, refused)
        finally:
            os.close(fd)
    if identity.cgroup.path:
        sent += cgroups.kill(identity.cgroup, cap)
    if identity.spawn_token:
        skip = identity.pid if root_matched else 0
        given_up = False
        try:
            stop_carriers(variable, identity.spawn_token.encode(), environ, refused, stopped, skip)
        except Abandoned:
            given_up = True  # the kill's next run, under way since, holds what this one stopped
            raise
        finally:
            if not given_up:  # and on a failure too: a carrier left stopped would stay stopped for good
                sent += stopped.kill(refused)
    return Killed(sent, tuple(sorted(refused)))
