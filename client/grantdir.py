"""Where a run keeps its grant file: a 0700 directory of its own under the temp directory, named for
the run's process (its pid namespace, pid and start ticks), so that a later run can tell the
leftovers of a dead one — a run killed -9 cannot remove its own — and remove them.

Guarantee: the temp directory (TMPDIR, else /tmp) is opened before anything is asked of the
coordinator as any directory a user names is (files.open_user_dir): a link on the way is followed
only when it is this user's or root's and no directory holding it or above may another user change,
so a link another user planted, at TMPDIR or anywhere on its way, never chooses where a run's
directory goes. Directories are made in it when no other user may rename in it (sticky, or written
by its owner alone, that owner root or this user, its group counted as others' only with another
member: files.swappable_because); else in a 0700 directory of this user's inside it
(`holdfast-<uid>`: an emptyDir a pod mounts at /tmp is 0777 without the sticky bit). Directories
above it that others may change are accepted alike: in either, another user can put a directory of
theirs on CMD's path, which leaves CMD no grant (below), never theirs. Refused before anything is
asked (INVALID_ARGUMENT, nothing made, no grant asked for, so no takeover's handoff) when a
`holdfast-<uid>` is there that is not this user's alone, or this user may not write and search where
the run's directory would be made (a read-only /tmp, TMPDIR=/usr for a user). Nothing is made, nor
any dead run's directory removed, until the run is granted: a refused run changes nothing there;
what still fails then (a full file system, one remounted read-only) is GRANT_DIR_FAILED, the grant
released (`unmade`). Nothing another user does in the temp directory meanwhile fails a granted
run (a takeover's handoff has ended the previous owner by then): the `holdfast-<uid>` `place` found
is held open from then and the run's directory made in it wherever they rename it; where there was
none and they put one in the way, a new `holdfast-<uid>-<random>` of this run's is made instead
(mkdir makes it or fails; lost only to another user renaming it away in the instant between its
mkdir and its open, four times running: `_private_dir`), where later runs find and sweep it. Each
directory is made and opened through a descriptor held on the one it is made in, never by a path
another user could make lead elsewhere, and the grant file is created through the run directory's
own descriptor. CMD is
given the grant file's path through no link (read back from the descriptor), and the run's own
directory is removed by its name through the descriptor held on the directory it was made in: never
a same-named directory where a link put in place of `holdfast-<uid>` meanwhile leads. A directory is
removed as a dead run's only when it is this user's, was named in this process's own pid namespace,
and the process it names is provably not running: its pid is absent, or held by a process that
started at other ticks. Never a live run's (its CMD reads the grant file from it), never one whose
process cannot be read, never another namespace's (a simulated host or a container sharing the temp
directory numbers its pids otherwise), and nothing by a run whose start ticks are shifted by its
time namespace's offsets (common/timens_rules: only in the initial one are they every reader's),
which names its own directory for no run to judge.
Not guaranteed where another user may rename in the temp directory or a directory above it: that
CMD, reading the grant file by its path, finds this run's — another user can rename `holdfast-<uid>`
(or the directory on the way) away and put a directory of theirs in its place; `Grant.from_file`
follows no link they made there and refuses a file not this user's alone, so CMD reads no grant
rather than theirs, or another run's. Nor that a `holdfast-<uid>` they renamed to a name of theirs
is swept: runs in it remove their own directories at their end, those killed -9 leave theirs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from holdfast.client.errors import ClientError
from holdfast.common import files, timens
from holdfast.common.reasons import Reason
from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import StatParseError, parse_stat

PREFIX = "holdfast-run-"
_NAME = re.compile(rf"{PREFIX}(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+")


def _pid_namespace() -> int | None:
    """This process's pid namespace, when the names it makes and reads can be judged: /proc is that
    namespace's (else pids read there are another namespace's), and the start ticks read there are
    every reader's (common/timens_rules: the kernel shifts them by the reader's time-namespace
    offsets, so a run under `unshare --time --boottime N` would read a live run's start as another
    and remove its directory, or name its own so that a run without offsets would)."""
    if timens.problem():
        return None
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


@dataclass(frozen=True)
class Place:
    """Where a run's grant directory will be made, chosen and checked before anything is asked:
    `fd`, a descriptor on the temp directory, and `path`, its path read back from that descriptor
    (through no link); `private`: made in this user's `holdfast-<uid>` there, not in it itself;
    `own`: a descriptor on that `holdfast-<uid>` when it was there, held until the run's directory
    is made in it — never opened again by its name, which another user may rename meanwhile."""

    path: str
    fd: int
    private: bool
    own: int | None = None

    @property
    def made_in(self) -> str:
        return os.path.join(self.path, _private_name()) if self.private else self.path

    def close(self) -> None:
        os.close(self.fd)
        if self.own is not None:
            os.close(self.own)


def temp_dir() -> str:
    """The temp directory as `tempfile` names it (tempfile.tempdir when set, else TMPDIR, TEMP or
    TMP, else /tmp), without `tempfile.gettempdir`'s probe: it writes a file there first, following
    every link on the way."""
    named = tempfile.tempdir or next((os.environ[name] for name in ("TMPDIR", "TEMP", "TMP")
                                      if os.environ.get(name)), "/tmp")
    return os.fspath(named)


def _private_name() -> str:
    return f"holdfast-{os.geteuid()}"


def place() -> Place:
    """The temp directory, opened as a directory a user named (files.open_user_dir: a link on the
    way followed only when it is this user's or root's and no directory above it may another user
    change); grant directories are made in it when no other user may rename in it
    (files.swappable_because), else in this user's `holdfast-<uid>` in it, refused now when one is
    there that is not this user's alone. Refused too (ClientError INVALID_ARGUMENT, nothing made,
    nothing asked) unless this user may write and search where `make` will make a directory: that
    `holdfast-<uid>` when it is there, else the temp directory — a TMPDIR the run may not write, or
    a read-only /tmp, is said now, never after the grant (and a takeover's handoff) was taken.
    Nothing is made: `make`, once granted, makes them."""
    named = temp_dir()
    try:
        fd, _ = files.open_user_dir(named)
    except OSError as exc:
        raise _refused(named, named, exc) from None
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if files.swappable_because(fd, path) is None:
            _check_writable(fd, path)
            return Place(path, fd, private=False)
        # Others may rename in it: the run's go in a directory of this user's there.
        private = os.path.join(path, _private_name())
        try:
            own = files.open_own_dir(fd, _private_name())
        except FileNotFoundError:
            _check_writable(fd, path)  # made there once granted
            return Place(path, fd, private=True)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, private) from None
        try:
            _check_writable(own, private)
        except BaseException:
            os.close(own)
            raise
        return Place(path, fd, private=True, own=own)
    except OSError as exc:
        os.close(fd)
        raise _refused(named, exc.filename or named, exc) from None
    except BaseException:
        os.close(fd)
        raise


def _check_writable(fd: int, where: str) -> None:
    """OSError naming `where` unless this process, by its effective ids, may make a directory in
    the one open as `fd`: write and search permission, on a file system mounted read-write."""
    if os.access(".", os.W_OK | os.X_OK, dir_fd=fd, effective_ids=True):
        return
    if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, "its file system is read-only", where)
    raise OSError(errno.EACCES, f"uid {os.geteuid()} may not write and search it", where)


def _refused(named: str, where: str, exc: OSError) -> ClientError:
    refused = ClientError(Reason.INVALID_ARGUMENT, f"{where} is not a directory this run may use: "
                          f"{exc.strerror}; nothing was made, nor a grant asked for. The grant file is kept "
                          f"in the temp directory ({named}: TMPDIR, else /tmp), which this user must be able "
                          "to write, reached through no link another user made or may swap")
    refused.hint = ("set TMPDIR to such a directory (or unset it: /tmp), or remove what another user put "
                    "there")
    return refused


def unmade(where: Place, exc: OSError, fence: int, session: str) -> ClientError:
    """What a failure to make the grant directory once granted (`make`, or the grant file in it) is:
    what `place` checked before the grant held then, so this is what it cannot foresee — a full
    file system, one remounted read-only — never what another user did in the temp directory
    (`make` goes around it)."""
    err = ClientError(Reason.GRANT_DIR_FAILED, f"fence {fence} was granted, but its grant file could not be "
                      f"made in {where.made_in}: {exc.filename or where.made_in}: {exc.strerror}; CMD did "
                      "not run", session)
    err.fence = fence
    return err


def make(where: Place) -> tuple[RunDir, int]:
    """Once granted: a new 0700 directory for this run's grant file where `where` says, after
    removing those of dead runs (of every directory `_homes` finds); and a descriptor on it, held
    from its making, in which the grant file is created (Grant.write). In the `holdfast-<uid>` that
    `place` found and holds, wherever another user renamed it since; where there was none, one made
    now (`_private_dir`). `where` stays the caller's to close. Nothing is made or removed before the
    grant: a refused run changes nothing in the temp directory. OSError when what `place` checked
    no longer holds (`unmade`)."""
    if not where.private:
        root_fd = os.dup(where.fd)
    elif where.own is not None:
        root_fd = os.dup(where.own)
    else:
        root_fd = _private_dir(where)
    try:
        root = os.readlink(f"/proc/self/fd/{root_fd}")  # its path now, through no link
        namespace = _pid_namespace()
        try:
            ticks = _start_ticks(os.getpid()) if namespace is not None else None
        except (OSError, StatParseError):
            ticks = None
        if namespace is None or ticks is None:
            prefix = "holdfast-"  # unnamed: no later run will judge it
        else:
            _sweep_homes(_homes(where), namespace, _gone)
            prefix = f"{PREFIX}{namespace}-{os.getpid()}-{ticks}-"
        name = files.make_dir(root_fd, prefix)
        return RunDir(os.path.join(root, name), root_fd), _open_own(root_fd, name, os.path.join(root, name))
    except BaseException:
        os.close(root_fd)
        raise


_PRIVATE_TRIES = 4  # `holdfast-<uid>`, then three names of this run's own


def _private_dir(where: Place) -> int:
    """A descriptor on a 0700 directory of this user's alone in the temp directory (one others may
    rename in), made now: `holdfast-<uid>`, made if missing; else, where another user put something
    in its way since `place` found none (their directory, a link, theirs renamed in its place), a
    new `holdfast-<uid>-<random>`, which mkdir makes or fails, so that nothing they do fails a run
    already granted (and, for a takeover, its previous owner already ended). Each is lost only to
    another user renaming it away in the instant between its mkdir and its open: OSError after
    `_PRIVATE_TRIES` such losses."""
    name = _private_name()
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=where.fd)
    tries = _PRIVATE_TRIES
    while True:
        try:
            return files.open_own_dir(where.fd, name)
        except OSError as exc:
            tries -= 1
            if not tries:
                raise OSError(exc.errno, exc.strerror, os.path.join(where.path, name)) from None
        name = files.make_dir(where.fd, f"{_private_name()}-")


def _open_own(parent: int, name: str, shown: str) -> int:
    """A descriptor on directory `name` in `parent`; OSError naming `shown` unless it is this user's
    alone (another user made or replaced it since `place`)."""
    try:
        return files.open_own_dir(parent, name)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, shown) from None


def _homes(where: Place) -> list[tuple[str, int]]:
    """The directories under `where` that this user's runs make their grant directories in, each
    with a descriptor of its own: the temp directory itself, or every `holdfast-<uid>` and
    `holdfast-<uid>-<random>` (`_private_dir`) there that is this user's alone. A `holdfast-<uid>`
    another user renamed to a name of theirs is not found: its runs remove their own directories
    from it, and those of runs killed -9 stay."""
    if not where.private:
        return [(where.path, os.dup(where.fd))]
    mine = re.compile(rf"{re.escape(_private_name())}(-[0-9a-f]{{12}})?")
    try:
        names = [name for name in os.listdir(where.fd) if mine.fullmatch(name)]
    except OSError:
        return []
    homes = []
    for name in names:
        with contextlib.suppress(OSError):
            homes.append((os.path.join(where.path, name), files.open_own_dir(where.fd, name)))
    return homes


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
    start is another namespace's that was given the freed inode number, and is kept. Nothing is
    removed where this process reads start times shifted (`_pid_namespace`): its ticks are not the
    names'."""
    if timens.problem():
        return []
    return _sweep_in(directory, namespace, lambda _pid, start_ticks: start_ticks < ended_at_ticks)


def _sweep_in(directory: str | None, namespace: int, dead: Callable[[int, int], bool]) -> list[str]:
    if directory is not None:
        try:
            return _sweep_homes([(directory, os.open(directory, files.OPEN_DIR))], namespace, dead)
        except OSError:
            return []
    try:
        where = place()
    except ClientError:
        return []
    try:
        homes = _homes(where)
    finally:
        where.close()
    return _sweep_homes(homes, namespace, dead)


def _sweep_homes(homes: list[tuple[str, int]], namespace: int, dead: Callable[[int, int], bool]) -> list[str]:
    """The paths of the dead runs' directories removed from `homes` (`_homes`), whose descriptors
    it closes."""
    removed = []
    for root, fd in homes:
        try:
            removed += [os.path.join(root, name) for name in _sweep(fd, namespace, dead)]
        finally:
            os.close(fd)
    return removed


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
