"""Ending an owner tree, only after its identity is proven.

Guarantee: every signal goes through a pidfd that was checked, after it was opened, to name the
process meant — the root by its recorded start ticks (and pidfs inode where there is one), a
carrier by the token in its environ — and that had not exited when checked, so a reused pid is
never hit (without pidfs an inode of 0 says nothing: the check is start ticks through the pidfd).
The session cgroup is ended with `cgroup.kill`, which the kernel applies to forks racing it. A
token carrier outside the cgroup is first stopped, every carrier until a stable scan finds no new
one, and only then killed: a tree that keeps forking cannot outrun a kill that stops it first.
A signal the kernel refuses (EPERM) is never read as the process's exit: it is reported refused.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from holdfast.agent.observe import pidfd_exited
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


def stop_carriers(variable: bytes, token: bytes, environ: EnvironReader, refused: set[str],
                  skip: int = 0) -> dict[int, int]:
    """SIGSTOP every carrier of the token until a stable scan shows none that is not stopped;
    returns the pidfds of the stopped ones (the caller kills and closes them). Every environ is read
    through `environ`: one that cannot be read is no carrier proven, and is not signalled. A stop
    the kernel refused is added to `refused`."""
    stopped: dict[int, int] = {}

    def carriers() -> tuple[list[int], bool]:
        found = scan(variable, token, environ=environ)
        return [c.pid for c in found.carriers if c.pid != skip], found.stable

    def stop(new: set[int]) -> list[int]:
        for pid in new:
            fd = _open_carrier(pid, variable, token, environ)
            if fd is not None and _send(fd, pid, signal.SIGSTOP, refused):
                stopped[pid] = fd
            elif fd is not None:
                os.close(fd)
        return [pid for pid in new if pid in stopped]  # one not stopped is looked at again

    try:
        stop_until_stable(carriers, stop, STOP_SECONDS)
    except BaseException:
        # Given up while stuck on a read (agent/reads.py): the kill runs again, and stops them again.
        for fd in stopped.values():
            os.close(fd)
        raise
    return stopped


def kill_tree(identity: agent_pb2.ProcessIdentity, variable: bytes, root_matched: bool,
              cap: cgroups.Capability, environ: EnvironReader) -> Killed:
    """The signals sent, and those refused. The root is signalled only when just judged
    IDENTITY_MATCHED and re-checked through its pidfd; the cgroup and the carriers whenever the root
    is matched or proven dead, since descendants outlive their root."""
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
        stopped = stop_carriers(variable, identity.spawn_token.encode(), environ, refused, skip)
        for pid, fd in stopped.items():
            try:
                sent += _send(fd, pid, signal.SIGKILL, refused)
            finally:
                os.close(fd)
    return Killed(sent, tuple(sorted(refused)))
