"""Where a run keeps its grant file: a 0700 directory of its own under the temp directory, named
for the run's process (its pid namespace, pid and start ticks), so that a later run can tell the
leftovers of a dead one — a run killed -9 cannot remove its own — and remove them.

Guarantee: a directory is removed only when it is this user's, was named in this process's own pid
namespace, and the process it names is provably not running: its pid is absent, or held by a
process that started at other ticks. Never a live run's (its CMD reads the grant file from it),
never one whose process cannot be read, never another namespace's (a simulated host or a
container sharing the temp directory numbers its pids otherwise). Directories are made in the
temp directory itself when no other user can rename or replace what is in it (sticky, or written
by its owner alone, that owner root or this user); else in a 0700 directory of this user's inside
it (`holdfast-<uid>`: an emptyDir a pod mounts at /tmp is 0777 without the sticky bit). Each is
made and opened through a descriptor held on that directory, never by a path another user could
make lead elsewhere, and the grant file is created through the run directory's own descriptor.
The descriptor on the directory a run's was made in is held to the run's end, and the run's is
removed by its name through it: never a same-named directory where a link put in place of
`holdfast-<uid>` meanwhile leads.
Not guaranteed where another user may rename in the temp directory: that CMD, reading the grant
file by its path, finds this run's — another user can put a directory of theirs in its place, and
`Grant.from_file` then refuses what it finds (not this user's), so CMD reads no grant rather than
theirs.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class RunDir:
    """A run's grant directory: `path` is shown to CMD, never used to reach it; `root` is a
    descriptor on the directory it was made in, held from its making to the run's end."""

    path: str
    root: int

    def remove(self) -> None:
        """Removes it and whatever CMD left in it, by its name in `root`, following no link, and
        closes `root`. Never by its path: in a temp directory others may rename in, another user
        may rename `holdfast-<uid>` away and put a link in its place, and a removal by path would
        remove a same-named directory wherever that link leads (as root: anywhere)."""
        with contextlib.suppress(OSError):
            files.remove_tree(self.root, os.path.basename(self.path))
        os.close(self.root)


def make() -> tuple[RunDir, int]:
    """A new 0700 directory for this run's grant file, after removing those of dead runs; and a
    descriptor on it, held from its making, in which the grant file is created (Grant.write)."""
    root, root_fd = _root()
    try:
        namespace = _pid_namespace()
        try:
            ticks = _start_ticks(os.getpid()) if namespace is not None else None
        except (OSError, StatParseError):
            ticks = None
        if namespace is None or ticks is None:
            prefix = "holdfast-"  # unnamed: no later run will judge it
        else:
            _sweep(root_fd, namespace, _gone)
            prefix = f"{PREFIX}{namespace}-{os.getpid()}-{ticks}-"
        name = files.make_dir(root_fd, prefix)
        return RunDir(os.path.join(root, name), root_fd), _open_own(root_fd, name, os.path.join(root, name))
    except BaseException:
        os.close(root_fd)
        raise


def _open_own(parent: int, name: str, shown: str) -> int:
    """A descriptor on directory `name` in `parent`, refused unless it is this user's alone."""
    try:
        return files.open_own_dir(parent, name)
    except OSError as exc:
        raise ClientError(Reason.INVALID_ARGUMENT, f"{shown} is not a directory this run may use: "
                          f"{exc.strerror}; another user may have made or replaced it: remove it, or set "
                          "TMPDIR to a directory only you may write; nothing was asked of the "
                          "coordinator") from None


def _root() -> tuple[str, int]:
    """The directory grant directories are made in, and a descriptor on it: the temp directory when
    no other user may rename or replace what is in it, else this user's own `holdfast-<uid>` in it."""
    base = tempfile.gettempdir()
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    others_rename = st.st_uid not in (0, os.getuid(), os.geteuid()) or (
        st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)
    if not others_rename:
        return base, fd
    private = f"holdfast-{os.geteuid()}"
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(private, 0o700, dir_fd=fd)
        return os.path.join(base, private), _open_own(fd, private, os.path.join(base, private))
    finally:
        os.close(fd)


def sweep(directory: str | None = None) -> list[str]:
    """Removes the grant directories of this user's dead runs in this pid namespace; returns them."""
    namespace = _pid_namespace()
    if namespace is None:
        return []
    return _sweep_in(directory, namespace, _gone)


def sweep_ended(namespace: int, ended_at_ticks: int, directory: str | None = None) -> list[str]:
    """Removes this user's grant directories of a pid namespace that has ended (a simulated host
    stopped or rebooted: no later run there sweeps them): each one named for a process that started
    before the namespace ended (`ended_at_ticks`, clock ticks since boot). One named for a later
    start is another namespace's that was given the freed inode number, and is kept."""
    return _sweep_in(directory, namespace, lambda _pid, start_ticks: start_ticks < ended_at_ticks)


def _sweep_in(directory: str | None, namespace: int, dead: Callable[[int, int], bool]) -> list[str]:
    try:
        root, fd = (directory, os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) \
            if directory else _root()
    except (OSError, ClientError):
        return []
    try:
        return [os.path.join(root, name) for name in _sweep(fd, namespace, dead)]
    finally:
        os.close(fd)


def _sweep(parent: int, namespace: int, dead: Callable[[int, int], bool]) -> list[str]:
    """The names of the dead runs' directories removed from the directory open as `parent`."""
    removed = []
    try:
        entries = list(os.scandir(parent))
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
            with contextlib.suppress(OSError):
                files.remove_tree(parent, entry.name)
                removed.append(entry.name)
    return removed
