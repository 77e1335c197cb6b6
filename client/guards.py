"""Fence guards for a session's own stores — SQL through DB-API (SQLite, PostgreSQL), Redis, a plain
directory: a write through a guard lands only while its fence is the newest the store has seen for
the session, and the store itself decides that, atomically.

`holdfast run --guard URL` raises each store's marker to the new grant's fence after the commit and
before the gate lets CMD run (`bump`), so the new owner's fence is in every guarded store before
anything of it writes: a superseded owner — paused, partitioned, a straggler — is refused at its
next guarded write even if the new owner never writes. (Fencing that compares only at the new
owner's first write leaves that window open.) A marker never goes down; a bump that finds a newer
marker fails, and `run` then releases its grant without running CMD.

How each store decides in one step:
- SQL: a write locks the session's marker row in its own transaction (`SELECT … FOR SHARE` in
  PostgreSQL; SQLite's database write lock, `BEGIN IMMEDIATE`) and compares; a bump is
  `… SET fence = GREATEST(fence, :f)`, which waits for those transactions: a stale write checked
  before a bump either commits before the bump completes — before the new CMD runs — or not at all.
- Redis: one script compares the marker and runs the write (a single instance: the write's keys
  are not declared to the script, so not for Redis Cluster; fences are exact below 2^53).
- A directory: a `gen-<fence>/` per grant, seeded with a copy of the current one, and a `current`
  symlink renamed into place under an flock; a stale owner's writes land in its own generation,
  which `current` no longer names. The flock must be shared by every writer's mount; a bump
  waits DIR_LOCK_WAIT_S for it at most, then fails naming its holder. The directory (0700) and
  its `.lock` (0600) are this user's alone (another user could swap a generation for a link, or
  hold the lock for ever); a bump copies
  rwx bits less group and other write, holes and hard links as such, no FIFO, socket or device,
  and at most a cap of data.
- A SQLite database is held to the directory's rules: its directory this user's alone, the
  database a regular file of this user's alone, never a link. Opened before the Acquire without
  creating anything; the database (0600) and, in any SQL store, the marker table are made only by
  the first bump, after a grant: a run refused writes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from holdfast.client import guard_rules
from holdfast.common import files
from holdfast.common.version import install_hint

MARKER_TABLE = "holdfast_fence"
SCHEMES = ("sqlite", "postgresql", "redis", "dir")
_GENERATION = re.compile(r"gen-(\d+)")
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class GuardError(Exception):
    """A store could not be guarded (unreachable, refused, malformed URL)."""


class StaleFence(GuardError):
    """The store has seen a newer fence for the session than this write's: refused, nothing written."""


def check_url(url: str) -> str:
    """A guard URL of a known scheme, with what that scheme needs; GuardError says what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise GuardError(f"{url!r}: a guard is one of {', '.join(s + '://' for s in SCHEMES)}")
    if parts.scheme in ("sqlite", "dir") and (parts.netloc or not parts.path.startswith("/")):
        raise GuardError(f"{url!r}: {parts.scheme}:// takes an absolute path, e.g. {parts.scheme}:///var/lib/x")
    if parts.scheme in ("sqlite", "dir") and {"", ".", ".."} & set(parts.path.split("/")[1:]):
        # Checked as written and followed by the kernel: `x/..` is the directory above x's target
        # when x is a link, not the one holding x, so a path that is not plain is never taken.
        raise GuardError(f"{url!r}: {parts.scheme}:// takes a plain path: no `.`, `..`, `//` or trailing `/`")
    if parts.scheme in ("postgresql", "redis") and not parts.hostname:
        raise GuardError(f"{url!r}: {parts.scheme}:// needs a host")
    if parts.scheme == "dir":
        dir_cap_bytes(url)
    return url


def open_guard(url: str, connect_timeout: float = 5.0) -> Guard:
    """The guard of `url`, connected and with its marker storage in place (GuardError otherwise)."""
    scheme = urlsplit(check_url(url)).scheme
    try:
        if scheme == "sqlite":
            return SqliteGuard(urlsplit(url).path, url)
        if scheme == "postgresql":
            import psycopg  # only a user of PostgreSQL guards needs it

            conn = psycopg.connect(url, autocommit=True, connect_timeout=max(int(connect_timeout), 1))
            return SqlGuard(conn, url)
        if scheme == "redis":
            import redis  # only a user of Redis guards needs it

            client = redis.Redis.from_url(url, socket_connect_timeout=connect_timeout)
            client.ping()
            return RedisGuard(client, url)
        return DirGuard(Path(urlsplit(url).path), url)
    except GuardError:
        raise
    except ImportError as exc:
        raise GuardError(f"{url}: {exc.name} is not installed ({install_hint('guards')})") from exc
    except Exception as exc:  # each driver has its own exception tree: say which store and why
        raise GuardError(f"{url}: {type(exc).__name__}: {exc}") from exc


class Guard(ABC):
    url: str

    @abstractmethod
    def bump(self, session: str, fence: int) -> None:
        """Raises the session's marker to `fence`; StaleFence if the store has seen a newer one."""

    @abstractmethod
    def marker(self, session: str) -> int:
        """The newest fence the store has seen for the session (0: none)."""

    @abstractmethod
    def close(self) -> None:
        """Releases the store's connection."""


# --- SQL ----------------------------------------------------------------------------------------
def _sqlite(conn: Any) -> bool:
    return type(conn).__module__ == "sqlite3"


def _sql(conn: Any, statement: str) -> str:
    """`statement` with `?` placeholders in the connection's own parameter style."""
    return statement if _sqlite(conn) else statement.replace("?", "%s")


@contextlib.contextmanager
def _transaction(conn: Any) -> Iterator[Any]:
    """One transaction that holds the write lock of the marker from its first statement (SQLite:
    BEGIN IMMEDIATE in autocommit mode, restored after; PostgreSQL: the row lock of FOR SHARE)."""
    if _sqlite(conn):
        previous, conn.isolation_level = conn.isolation_level, None
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        finally:
            conn.isolation_level = previous
        return
    with conn.transaction(), conn.cursor() as cur:
        yield cur


def _ensure_marker_table(cur: Any) -> None:
    cur.execute(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (session TEXT PRIMARY KEY, "
                "fence BIGINT NOT NULL)")


def _raise_marker(conn: Any, cur: Any, session: str, fence: int) -> None:
    greatest = "MAX" if _sqlite(conn) else "GREATEST"
    cur.execute(_sql(conn, f"INSERT INTO {MARKER_TABLE} (session, fence) VALUES (?, ?) ON CONFLICT (session) "
                           f"DO UPDATE SET fence = {greatest}({MARKER_TABLE}.fence, excluded.fence)"),
                (session, fence))


def _has_marker_table(conn: Any, cur: Any) -> bool:
    if _sqlite(conn):
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MARKER_TABLE,))
        return cur.fetchone() is not None
    cur.execute("SELECT to_regclass(%s)", (MARKER_TABLE,))
    return cur.fetchone()[0] is not None


def _locked_marker(conn: Any, cur: Any, session: str) -> int:
    share = "" if _sqlite(conn) else " FOR SHARE"  # SQLite: BEGIN IMMEDIATE already holds the lock
    cur.execute(_sql(conn, f"SELECT fence FROM {MARKER_TABLE} WHERE session = ?{share}"), (session,))
    row = cur.fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def sql_write(conn: Any, session: str, fence: int) -> Iterator[Any]:
    """A transaction on a DB-API connection (sqlite3 or psycopg) whose writes commit only while
    `fence` is the newest the database has seen for `session`: yields a cursor; StaleFence (and a
    rollback) otherwise. The marker row stays locked until the commit, so no bump passes it."""
    with _transaction(conn) as cur:
        _ensure_marker_table(cur)  # a database no run has guarded yet has seen no fence
        seen = _locked_marker(conn, cur, session)
        if seen > fence:
            raise StaleFence(f"session {session}: fence {fence} is superseded by {seen} in this database")
        if seen < fence:
            _raise_marker(conn, cur, session, fence)
        yield cur


class SqlGuard(Guard):
    def __init__(self, conn: Any, url: str) -> None:
        self.conn, self.url = conn, url

    def bump(self, session: str, fence: int) -> None:
        with _transaction(self.conn) as cur:
            # The marker table is made here, after a grant, never when opened before the Acquire:
            # a run refused (HELD) has written nothing in the store.
            _ensure_marker_table(cur)
            _raise_marker(self.conn, cur, session, fence)
            seen = _locked_marker(self.conn, cur, session)
        if seen != fence:
            raise StaleFence(f"{self.url}: session {session} is at fence {seen} there, newer than {fence}")

    def marker(self, session: str) -> int:
        with _transaction(self.conn) as cur:
            return _locked_marker(self.conn, cur, session) if _has_marker_table(self.conn, cur) else 0

    def close(self) -> None:
        self.conn.close()


class SqliteGuard(SqlGuard):
    """A SQLite database held to a dir:// guard's rules: its directory this user's alone, in
    directories no other user may change (files.open_private_path), and the database a regular
    file of this user's alone, never a link. Another user's link at the name, or in a directory of
    theirs on the way, took a root run's writes — SQLite's header over a file of root's — wherever
    they chose. Before the Acquire an existing database is opened read-write without creating
    anything and a missing one is not made; the first bump, after a grant, makes it (0600) and its
    marker table. SQLite itself refuses to open a -journal or -wal file that is a link."""

    def __init__(self, path: str, url: str) -> None:
        super().__init__(None, url)
        self.path = path
        top = self._directory()
        try:
            if self._existing(top):
                self.conn = self._connect()
        finally:
            os.close(top)

    def _directory(self) -> int:
        try:
            return _checked(self.url, files.open_private_path, os.path.dirname(self.path), False)
        except FileNotFoundError:
            raise GuardError(f"{self.url}: {os.path.dirname(self.path)} does not exist") from None

    def _existing(self, top: int) -> bool:
        """Whether the database is there, in the directory open as `top`; GuardError when it is a
        link or not a regular file of this user's alone."""
        name = os.path.basename(self.path)
        try:
            if stat.S_ISLNK(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
                raise GuardError(f"{self.url}: {self.path} is a link: a sqlite:// guard's database is never "
                                 "opened through one (docs/guards.md)")
        except FileNotFoundError:
            return False
        os.close(_checked(self.url, files.open_private_file, top, name, os.O_RDONLY))
        return True

    def _connect(self) -> Any:
        import sqlite3  # here, not at the top: `run` without a guard never pays for it

        # mode=rw: never made by the connection. Opened and bumped from worker threads (never two
        # at once): not tied to one thread.
        return sqlite3.connect(f"file:{quote(self.path)}?mode=rw", uri=True, timeout=30.0,
                               check_same_thread=False)

    def bump(self, session: str, fence: int) -> None:
        if self.conn is None:
            top = self._directory()
            try:
                name = os.path.basename(self.path)
                try:
                    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    os.close(os.open(name, new, 0o600, dir_fd=top))
                except FileExistsError:
                    self._existing(top)  # made since it was opened: checked as found
            finally:
                os.close(top)
            self.conn = self._connect()
        super().bump(session, fence)

    def marker(self, session: str) -> int:
        return 0 if self.conn is None else super().marker(session)  # no database: no fence seen

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# --- Redis ----------------------------------------------------------------------------------------
# KEYS[1] the marker; ARGV[1] the fence; ARGV[2..] a command to run only if the fence is current.
_REDIS_WRITE = """
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < seen then return redis.error_reply('STALE_FENCE ' .. seen) end
if fence > seen then redis.call('SET', KEYS[1], ARGV[1]) end
if #ARGV > 1 then return redis.call(unpack(ARGV, 2)) end
return seen
"""


def redis_marker_key(session: str) -> str:
    return f"holdfast:fence:{session}"


def redis_write(client: Any, session: str, fence: int, *command: str | bytes | int) -> Any:
    """Runs `command` (e.g. "SET", "k", "v") only while `fence` is the newest Redis has seen for
    the session, in one script; StaleFence otherwise (nothing run)."""
    import redis

    try:
        return client.eval(_REDIS_WRITE, 1, redis_marker_key(session), fence, *command)
    except redis.ResponseError as exc:
        if str(exc).startswith("STALE_FENCE"):
            raise StaleFence(f"session {session}: fence {fence} is superseded by {str(exc).split()[1]} "
                             "in this Redis") from None
        raise


class RedisGuard(Guard):
    def __init__(self, client: Any, url: str) -> None:
        self.client, self.url = client, url

    def bump(self, session: str, fence: int) -> None:
        try:
            redis_write(self.client, session, fence)
        except StaleFence as exc:
            raise StaleFence(f"{self.url}: {exc}") from None

    def marker(self, session: str) -> int:
        return int(self.client.get(redis_marker_key(session)) or 0)

    def close(self) -> None:
        self.client.close()


# --- a directory ----------------------------------------------------------------------------------
DIR_CAP_BYTES = 1 << 30  # a generation's data, unless the URL says `?cap_bytes=N`
# How long a bump waits for another's `.lock`: a bump holds it while it copies (1 GiB at most, by
# default), and a run waiting longer holds its grant with CMD not started.
DIR_LOCK_WAIT_S = 10.0
_T = TypeVar("_T")


def _checked(url: str, check: Callable[..., _T], *args: Any) -> _T:
    """`check(*args)`, a files check of the dir:// or sqlite:// guard `url`'s path; its refusal
    as GuardError."""
    try:
        return check(*args)
    except (files.NotPrivate, files.UntrustedLink) as exc:
        what = "directory" if urlsplit(url).scheme == "dir" else "database and its directory"
        raise GuardError(f"{url}: {exc} — a {urlsplit(url).scheme}:// guard's {what} must be this user's "
                         "alone, in directories no other user may change (docs/guards.md)") from None


def dir_cap_bytes(url: str) -> int:
    """The cap on the bytes of data a bump of the dir:// guard `url` copies: `?cap_bytes=N` (N > 0)
    or DIR_CAP_BYTES; GuardError for any other query."""
    query = urlsplit(url).query
    if not query:
        return DIR_CAP_BYTES
    key, _, value = query.partition("=")
    cap = guard_rules.cap_bytes(value) if key == "cap_bytes" else None
    if cap is None:
        raise GuardError(f"{url!r}: a dir:// guard takes only ?cap_bytes=N, N > 0 in at most 19 ASCII digits "
                         f"(bytes of data a bump copies; default {DIR_CAP_BYTES})")
    return cap


def _current(root: Path, top: int | None = None) -> int:
    """The fence of the generation `current` names (0: none yet), read in the directory open as
    `top` when given, else by the path `root`."""
    try:
        found = _GENERATION.fullmatch(os.readlink("current" if top is not None else root / "current",
                                                  dir_fd=top))
    except FileNotFoundError:
        return 0
    if found is None:
        raise GuardError(f"{root}/current names no gen-<fence> directory")
    return int(found[1])


def dir_write_path(root: str | os.PathLike[str], fence: int) -> Path:
    """The directory this fence writes in: `gen-<fence>/`, while `current` names it; StaleFence
    once a newer grant's generation is current (what is written there is then never read). A
    path, followed by name: it leads where the guard's directory says only because no one but
    this user may change that directory, which every bump requires (DirGuard)."""
    path = Path(root)
    seen = _current(path)
    if seen != fence:
        raise StaleFence(f"{path}: the current generation is fence {seen}, not {fence}")
    return path / f"gen-{fence}"


class DirGuard(Guard):
    """A directory of this user's alone (files.open_private_path, as `holdfast up`'s state
    directory): another user's, one others may write, a link another user put at its name or
    under a directory another user may change is refused, never made, copied or written through.
    Shared with another user it could not be safe: CMD writes under `dir_write_path` by name, so
    that user could swap `gen-N` for a link to anywhere CMD may write; and a root bump would copy
    what they left there as root's."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url, self.cap_bytes = root, url, dir_cap_bytes(url)
        # Checked now, before the Acquire, but made only by the first bump, once granted: a run
        # refused (HELD) has made nothing; and a path under another user's directory is refused
        # here, not at the bump, after a grant had ended the previous owner.
        top = self._private(files.open_existing_private_path, root)
        if top is None:
            return
        try:
            _current(root, top)  # a `current` that names something else is refused before any grant
        finally:
            os.close(top)

    def _private(self, check: Callable[..., _T], *args: Any) -> _T:
        return _checked(self.url, check, *args)

    def _open(self, make: bool) -> int:
        top = self._private(files.open_private_path, self.root, make)
        if make:
            # Its user's alone, as `.lock` is: another user who could open `.lock` could flock it and
            # hold every bump (flock needs no write access); neither is theirs to read.
            try:
                os.fchmod(top, stat.S_IMODE(os.fstat(top).st_mode) & 0o700)
            except BaseException:
                os.close(top)
                raise
        return top

    def bump(self, session: str, fence: int) -> None:
        # Everything is reached from one descriptor on the directory, and a `.lock` (a link, or a
        # FIFO that would be waited on forever), a generation or a staging directory replaced by
        # a link — by a stale writer of this user's, or by a CMD gone astray — is refused, never
        # opened, copied or written through.
        top = self._open(make=True)
        try:
            fd = os.open(".lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o600, dir_fd=top)
            with open(fd, "rb"):  # closed, the lock with it, however the bump ends
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise GuardError(f"{self.url}: .lock is not a regular file")
                os.fchmod(fd, 0o600)  # one an earlier version made 0644: nobody else opens it again
                self._lock(fd)
                self._bump_locked(top, fence)
        finally:
            os.close(top)

    def _lock(self, fd: int) -> None:
        """`.lock` (open as `fd`) flocked, waited for DIR_LOCK_WAIT_S at most: a process that holds
        it for ever — one that opened it while others could — never holds the run, with its
        grant, for ever. GuardError naming the holder then, before anything is written."""
        deadline, pause = time.monotonic() + DIR_LOCK_WAIT_S, 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.25)
        st = os.fstat(fd)
        raise GuardError(f"{self.url}: {self.root / '.lock'} is held by {_lock_holders(st)} and was not "
                         f"released in {DIR_LOCK_WAIT_S:g} s; no generation was made. A bump holds it "
                         "while it copies the current generation: if the holder is not one, end it (or "
                         "find why it holds the lock), then run again")

    def _bump_locked(self, top: int, fence: int) -> None:
        seen = _current(self.root, top)
        if seen > fence:
            raise StaleFence(f"{self.url}: generation {seen} is current, newer than fence {fence}")
        if seen == fence:
            return
        made, staging = f"gen-{fence}", f".gen-{fence}.staging"
        with contextlib.suppress(OSError):
            files.remove_tree(top, staging)
        os.mkdir(staging, 0o777, dir_fd=top)
        try:
            if seen:
                self._seed(top, f"gen-{seen}", staging, made)
            with contextlib.suppress(OSError):
                files.remove_tree(top, made)  # a bump that died between its two renames
            os.rename(staging, made, src_dir_fd=top, dst_dir_fd=top)
        except BaseException:
            # A bump that failed leaves no staging behind: each would be another copy's size.
            with contextlib.suppress(OSError):
                files.remove_tree(top, staging)
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(".current.staging", dir_fd=top)
        os.symlink(made, ".current.staging", dir_fd=top)
        os.replace(".current.staging", "current", src_dir_fd=top, dst_dir_fd=top)

    def _seed(self, top: int, current: str, staging: str, made: str) -> None:
        """The generation `current` copied into `staging`, which becomes `made`."""
        into = os.open(staging, OPEN_DIR, dir_fd=top)
        try:
            try:
                source = os.open(current, OPEN_DIR, dir_fd=top)
            except OSError:
                raise GuardError(
                    f"{self.url}: {current} is not a directory (a link is never copied through)") from None
            try:
                # Files of another uid are copied, not refused: in a directory this user's alone only
                # this user (root, for a root bump) put them there, as a CMD handing files to an app
                # user does; what made one a way to root — a setuid or setgid bit turned root's in
                # the copy, or a write bit for others on root's copy — is never copied
                # (files.copied_mode).
                skipped = files.copy_tree(source, into, self.cap_bytes)
                os.fchmod(into, files.copied_mode(os.fstat(source).st_mode))
            except files.OverCap:
                raise GuardError(
                    f"{self.url}: {current} holds more than {self.cap_bytes} bytes of data, the cap on what "
                    f"a bump copies (?cap_bytes=N in the guard URL, default {DIR_CAP_BYTES}): nothing "
                    f"was copied; remove what CMD no longer needs from {self.root / current}, or raise "
                    "the cap") from None
            finally:
                os.close(source)
        finally:
            os.close(into)
        if skipped:
            print(f"holdfast: {self.url}: not copied into {made} (only files, directories and links "
                  f"are, as found): {', '.join(skipped)}", file=sys.stderr, flush=True)

    def marker(self, session: str) -> int:
        try:
            top = self._open(make=False)
        except FileNotFoundError:
            return 0
        try:
            return _current(self.root, top)
        finally:
            os.close(top)

    def close(self) -> None:
        """Nothing held between calls: the lock is taken per bump."""


def _lock_holders(st: os.stat_result) -> str:
    """Who holds an flock on the file `st` describes, in words, by /proc/locks."""
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    try:
        with open("/proc/locks") as f:
            pids = guard_rules.flock_holders(f.read(), major, minor, st.st_ino)
    except OSError:
        pids = []
    if not pids:  # the kernel hides the locks of processes outside this pid namespace
        return (f"a process /proc/locks does not show here (`grep {major:02x}:{minor:02x}:{st.st_ino} "
                "/proc/locks` outside this pid namespace names it)")
    return ", ".join(_process(pid) for pid in pids)


def _process(pid: int) -> str:
    """`pid 123 (uid 65534, python3)`, as much of it as /proc shows."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/comm") as f:
            return f"pid {pid} (uid {uid}, {f.read().strip()!r})"
    except OSError:
        return f"pid {pid}"


def bump_all(guards: Sequence[Guard], session: str, fence: int) -> None:
    """Every store's marker raised to `fence`, in order; the first failure raises GuardError."""
    for guard in guards:
        try:
            guard.bump(session, fence)
        except GuardError:
            raise
        except Exception as exc:
            raise GuardError(f"{guard.url}: {type(exc).__name__}: {exc}") from exc
