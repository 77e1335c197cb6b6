"""Where a run keeps its grant file: a 0700 directory of its own under the temp directory, named
for the run's process (its pid namespace, pid and start ticks), so that a later run can tell the
leftovers of a dead one — a run killed -9 cannot remove its own — and remove them.

Guarantee: a directory is removed only when it is this user's, was named in this process's own pid
namespace, and the process it names is provably not running: its pid is absent, or held by a
process that started at other ticks. Never a live run's (its CMD reads the grant file from it),
never one whose process cannot be read, never another namespace's (a simulated host or a
container sharing the temp directory numbers its pids otherwise). A directory is made only in a
temp directory where no other user can rename or replace it (sticky, or written by its owner alone,
and that owner root or this user), and held open from its making: the grant file is created through
that descriptor, never by a path another user could make lead elsewhere.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable

from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.common.reasons import Reason
from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import StatParseError, parse_stat

PREFIX = "holdfast-run-"
_NAME = re.compile(rf"{PREFIX}(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+")


def _pid_namespace() -> int | None:
    """This process's pid namespace, when /proc is that namespace's (else pids read there are
    another namespace's, and nothing may be judged from them)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """None: no such process. Raises OSError or StatParseError when it cannot be read."""
    try:
        return parse_stat(read_proc_file(f"/proc/{pid}/stat")).start_ticks
    except (FileNotFoundError, ProcessLookupError):
        return None


def _gone(pid: int, start_ticks: int) -> bool:
    try:
        now = _start_ticks(pid)
    except (OSError, StatParseError):
        return False  # cannot tell: keep it
    return now is None or now != start_ticks


def make() -> tuple[str, int]:
    """A new 0700 directory for this run's grant file, after removing those of dead runs: its path
    and a descriptor on it, held from its making, in which the grant file is created (Grant.write).
    Refuses (INVALID_ARGUMENT, before anything is asked) a temporary directory that another user
    could swap it in: the grant file, secret inside, would be created wherever they chose."""
    base = tempfile.gettempdir()
    _check_temp_dir(base)
    namespace = _pid_namespace()
    try:
        ticks = _start_ticks(os.getpid()) if namespace is not None else None
    except (OSError, StatParseError):
        ticks = None
    if namespace is None or ticks is None:
        path = tempfile.mkdtemp(prefix="holdfast-", dir=base)  # unnamed: no later run will judge it
    else:
        sweep()
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{namespace}-{os.getpid()}-{ticks}-", dir=base)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:  # not the directory mkdtemp just made
        os.close(fd)
        raise ClientError(Reason.INVALID_ARGUMENT, f"{path}, this run's grant directory, was replaced "
                          "as soon as it was made; nothing was asked of the coordinator")
    return path, fd


def _check_temp_dir(base: str) -> None:
    """Refuses a TMPDIR where another user may rename or replace this run's directory: one that
    others may write without the sticky bit, or one another user (not root) owns."""
    st = os.stat(base)
    if st.st_uid not in (0, os.getuid(), os.geteuid()):
        why = f"belongs to uid {st.st_uid}"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        why = "may be written by others and has no sticky bit"
    else:
        return
    raise ClientError(Reason.INVALID_ARGUMENT, f"the temporary directory {base} (TMPDIR) {why}: another "
                      "user could replace this run's grant directory in it; set TMPDIR to a directory only "
                      f"you may write, or make it sticky (chmod +t {base}); nothing was asked of the "
                      "coordinator")


def sweep(directory: str | None = None) -> list[str]:
    """Removes the grant directories of this user's dead runs in this pid namespace; returns them."""
    namespace = _pid_namespace()
    if namespace is None:
        return []
    return _sweep(directory, namespace, _gone)


def sweep_ended(namespace: int, ended_at_ticks: int, directory: str | None = None) -> list[str]:
    """Removes this user's grant directories of a pid namespace that has ended (a simulated host
    stopped or rebooted: no later run there sweeps them): each one named for a process that started
    before the namespace ended (`ended_at_ticks`, clock ticks since boot). One named for a later
    start is another namespace's that was given the freed inode number, and is kept."""
    return _sweep(directory, namespace, lambda _pid, start_ticks: start_ticks < ended_at_ticks)


def _sweep(directory: str | None, namespace: int, dead: Callable[[int, int], bool]) -> list[str]:
    removed = []
    base = directory or tempfile.gettempdir()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for entry in entries:
        found = _NAME.fullmatch(entry.name)
        if found is None or int(found[1]) != namespace:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if dead(int(found[2]), int(found[3])):
            files.remove_quietly(entry.path)
            removed.append(entry.path)
    return removed
