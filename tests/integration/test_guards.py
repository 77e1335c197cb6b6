"""Fence guards against the real stores (issue 15): a real SQLite file, PostgreSQL and Redis servers
started here on loopback ports, and a directory. A write lands only while its fence is the newest
the store has seen; a bump makes the new fence the newest before the new owner writes; a stale
write that checked before a bump either commits before the bump completes or not at all."""

from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from holdfast.client import guards
from holdfast.client.guards import GuardError, StaleFence
from holdfast.common import files
from tests.integration.stores import free_port, postgres_server, redis_server
from tests.integration.unprivileged import DROP, NOBODY

pytestmark = pytest.mark.timeout(120)
SESSION = "sess-guard-0001"
BLOCKED_S = 0.5  # how long a bump must stay blocked behind a stale writer's lock to count as blocked


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


class Store:
    """One guarded store as a writer sees it: a guarded write of `value`, and what was written."""

    def __init__(self, url: str, write: Callable[[int, str], None], written: Callable[[], list[str]]) -> None:
        self.url, self.write, self.written = url, write, written


def sql_store(url: str, connect: Callable[[], Any], table: str) -> Store:
    conn = connect()
    with guards.sql_write(conn, "setup-only-0001", 1) as cur:  # makes nothing of SESSION's
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (v TEXT)")

    def write(fence: int, value: str) -> None:
        with guards.sql_write(conn, SESSION, fence) as cur:
            cur.execute(f"INSERT INTO {table} (v) VALUES ({'?' if 'sqlite' in url else '%s'})", (value,))

    def written() -> list[str]:
        with guards.sql_write(conn, "setup-only-0001", 1) as cur:
            cur.execute(f"SELECT v FROM {table}")
            return sorted(r[0] for r in cur.fetchall())

    return Store(url, write, written)


@pytest.fixture(params=["sqlite", "postgresql", "redis", "dir"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    kind = request.param
    table = f"t_{tmp_path.name.replace('-', '_').replace('[', '_').replace(']', '_')}"
    if kind == "sqlite":
        url = f"sqlite://{tmp_path / 'db.sqlite'}"
        return sql_store(url, lambda: sqlite3.connect(tmp_path / "db.sqlite", timeout=30), table)
    if kind == "postgresql":
        url = request.getfixturevalue("postgres")
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {guards.MARKER_TABLE}")
        return sql_store(url, lambda: psycopg.connect(url), table)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)
        client.flushdb()

        def push(fence: int, value: str) -> None:
            guards.redis_write(client, SESSION, fence, "RPUSH", "log", value)

        return Store(url, push, lambda: sorted(v.decode() for v in client.lrange("log", 0, -1)))
    root = tmp_path / "state"

    def write(fence: int, value: str) -> None:
        (guards.dir_write_path(root, fence) / value).write_text(value)

    return Store(f"dir://{root}", write, lambda: sorted(p.name for p in (root / "current").iterdir()))


def test_a_bump_makes_the_new_fence_the_newest_and_refuses_the_old_one(store: Store) -> None:
    guard = guards.open_guard(store.url)
    try:
        guard.bump(SESSION, 1)
        store.write(1, "one")
        guard.bump(SESSION, 2)  # the new owner's fence, before it has written anything
        assert guard.marker(SESSION) == 2
        with pytest.raises(StaleFence):
            store.write(1, "stale")  # the superseded owner's next write
        store.write(2, "two")
        assert store.written() == ["one", "two"]  # the stale write left nothing behind
        with pytest.raises(StaleFence):
            guard.bump(SESSION, 1)  # a marker never goes down
        assert guard.marker(SESSION) == 2
    finally:
        guard.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_stale_write_checked_before_the_bump_commits_before_it_or_not_at_all(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "sqlite":
        url = f"sqlite://{tmp_path / 'db.sqlite'}"
        connect: Callable[[], Any] = lambda: sqlite3.connect(  # noqa: E731
            tmp_path / "db.sqlite", timeout=30, check_same_thread=False)
    else:
        url = request.getfixturevalue("postgres")
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {guards.MARKER_TABLE}")
            admin.execute("DROP TABLE IF EXISTS interleaved")
        connect = lambda: psycopg.connect(url)  # noqa: E731
    guard = guards.open_guard(url)
    stale = connect()
    with guards.sql_write(stale, SESSION, 1) as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS interleaved (v TEXT)")
    checked, go, bumped = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def stale_writer() -> None:
        try:
            with guards.sql_write(stale, SESSION, 1) as cur:  # checked: fence 1 is the newest
                cur.execute("INSERT INTO interleaved (v) VALUES ('stale-1')")
                checked.set()
                go.wait(30)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def bumper() -> None:
        guard.bump(SESSION, 2)
        bumped.set()

    writer = threading.Thread(target=stale_writer)
    writer.start()
    assert checked.wait(30)
    bump = threading.Thread(target=bumper)
    bump.start()
    # The bump waits for the stale writer's lock: it cannot complete while that write is open.
    assert not bumped.wait(BLOCKED_S), "the bump passed a write that checked the old fence"
    go.set()
    writer.join(30)
    bump.join(30)
    assert bumped.is_set() and not errors
    assert guard.marker(SESSION) == 2
    # The stale owner's next write, after the bump:
    with pytest.raises(StaleFence), guards.sql_write(stale, SESSION, 1) as cur:
        cur.execute("INSERT INTO interleaved (v) VALUES ('stale-2')")
    reader = connect()
    with guards.sql_write(reader, SESSION, 2) as cur:
        cur.execute("SELECT v FROM interleaved")
        assert [r[0] for r in cur.fetchall()] == ["stale-1"]  # committed before the bump, never after
    for conn in (stale, reader):
        conn.close()
    guard.close()


def test_a_dir_guard_seeds_the_new_generation_and_hides_stale_writes(tmp_path: Path) -> None:
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    (guards.dir_write_path(root, 1) / "transcript").write_text("turn 1")
    stale_dir = guards.dir_write_path(root, 1)
    guard.bump(SESSION, 3)
    assert (root / "current" / "transcript").read_text() == "turn 1"  # carried into generation 3
    (stale_dir / "transcript").write_text("stale turn")  # a straggler that kept its old path
    assert (root / "current" / "transcript").read_text() == "turn 1"
    with pytest.raises(StaleFence):
        guards.dir_write_path(root, 1)


@pytest.mark.parametrize("url,says", [
    ("mysql://127.0.0.1/db", "a guard is one of"),
    ("sqlite://relative.db", "takes an absolute path"),
    ("dir://relative", "takes an absolute path"),
    ("dir:///srv/x?cap=1", "takes only \\?cap_bytes=N"),
    ("dir:///srv/x?cap_bytes=0", "takes only \\?cap_bytes=N"),
    ("dir:///srv/x?cap_bytes=\u00b2", "takes only \\?cap_bytes=N"),  # str.isdigit's, int()'s ValueError
    ("dir:///srv/x?cap_bytes=\u0661\u0660", "takes only \\?cap_bytes=N"),  # Arabic-Indic 10, taken as 10
    ("dir:///srv/x?cap_bytes=" + "9" * 5000, "takes only \\?cap_bytes=N"),  # int()'s digit limit
    ("dir:///srv/x?cap_bytes=-1", "takes only \\?cap_bytes=N"),
    ("dir:///tmp/x/../g", "takes a plain path"),  # the kernel climbs from x's target, not from /tmp
    ("dir:///tmp/./g", "takes a plain path"),
    ("dir:///tmp//g", "takes a plain path"),
    ("dir:///tmp/g/", "takes a plain path"),
    ("sqlite:///tmp/x/../g.db", "takes a plain path"),
    ("redis:///0", "needs a host"),
])
def test_a_malformed_guard_url_is_refused_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(GuardError, match=says):
        guards.check_url(url)
    with pytest.raises(GuardError, match=says):  # the library's way in, too: never a raw ValueError
        guards.open_guard(url)


def test_an_unreachable_store_is_a_guard_error_naming_it() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(GuardError, match=url):
        guards.open_guard(url, connect_timeout=2)


def test_a_dir_guard_opens_and_copies_through_no_link(tmp_path: Path) -> None:
    root, victim = tmp_path / "home", tmp_path / "victim"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    (root / ".lock").unlink()
    (root / ".lock").symlink_to(victim)  # planted by an earlier owner sharing the directory
    with pytest.raises(OSError):
        guard.bump(SESSION, 2)
    assert not victim.exists(), "the lock was not created through the link"
    (root / ".lock").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("not to be copied")
    os.rename(root / "gen-1", tmp_path / "gen-1-moved")
    (root / "gen-1").symlink_to(elsewhere)
    with pytest.raises(GuardError, match="gen-1 is not a directory"):
        guard.bump(SESSION, 2)
    assert not (root / "gen-2").exists() and guards.dir_write_path(root, 1) == root / "gen-1"


def test_a_dir_guard_copies_into_no_link_swapped_in_for_its_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer of the shared directory swaps `.gen-N.staging` for a link just after the
    bump makes it: copytree then wrote the generation's files through the link, as root, into
    whatever directory it named."""
    root, victim = tmp_path / "home", tmp_path / "victim"
    victim.mkdir()
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    (guards.dir_write_path(root, 1) / "cron-job").write_text("* * * * * root evil")
    real_mkdir = os.mkdir

    def mkdir_then_swap(path: str, *args: object, **kwargs: object) -> None:
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]
        if os.fspath(path).endswith(".staging"):  # the other writer, just in time
            os.rename(root / ".gen-2.staging", tmp_path / "moved")
            (root / ".gen-2.staging").symlink_to(victim)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises((GuardError, OSError)):
        guard.bump(SESSION, 2)
    monkeypatch.undo()
    assert list(victim.iterdir()) == [], "nothing was written through the link"


def test_a_dir_guard_lock_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """An earlier owner leaves `.lock` as a FIFO: opening it for reading waited for a writer
    forever, so every later bump (and the run waiting on it) hung."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    root.mkdir(exist_ok=True)
    os.mkfifo(root / ".lock")
    failed: list[BaseException] = []

    def bump() -> None:
        try:
            guard.bump(SESSION, 1)
        except BaseException as exc:  # the refusal this test expects
            failed.append(exc)

    worker = threading.Thread(target=bump, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # free it: a writer at the FIFO's other end
        os.close(os.open(root / ".lock", os.O_WRONLY | os.O_NONBLOCK))
        worker.join()
        pytest.fail("bump waited on a FIFO at .lock")
    assert failed and isinstance(failed[0], (GuardError, OSError))


def test_a_dir_guard_and_its_lock_are_its_users_alone(tmp_path: Path) -> None:
    """`.lock` was made 0644 in a 0755 directory: any local user could open it for reading and
    flock it (flock needs no write access), holding every later bump. A directory or `.lock` an
    earlier version made open to others is closed by the next bump."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    assert [stat.S_IMODE(p.stat().st_mode) for p in (root, root / ".lock")] == [0o700, 0o600]
    os.chmod(root, 0o755)
    os.chmod(root / ".lock", 0o644)
    guard.bump(SESSION, 2)
    assert [stat.S_IMODE(p.stat().st_mode) for p in (root, root / ".lock")] == [0o700, 0o600]


def test_a_bump_waits_for_a_held_lock_a_bounded_time_naming_its_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that holds `.lock` and never lets go — one that opened it while others could —
    held the bump, and the run with its grant, for ever, saying nothing. It fails once the wait is
    over, naming the lock and its holder, with no generation made."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    monkeypatch.setattr(guards, "DIR_LOCK_WAIT_S", 0.5)
    failed: list[BaseException] = []
    done = threading.Event()

    def bump() -> None:
        try:
            guard.bump(SESSION, 2)
        except BaseException as exc:  # the refusal this test expects
            failed.append(exc)
        done.set()

    with open(root / ".lock", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        threading.Thread(target=bump, daemon=True).start()
        finished = done.wait(30)
    done.wait()  # the lock released: a bump still waiting ends
    assert finished, "the bump waited on the held lock without end"
    assert len(failed) == 1 and isinstance(failed[0], GuardError), failed
    assert f"{root}/.lock is held by pid {os.getpid()} (uid {os.geteuid()}" in str(failed[0])
    assert "no generation was made" in str(failed[0])
    assert sorted(p.name for p in root.iterdir()) == [".lock", "current", "gen-1"]
    guard.bump(SESSION, 2)  # released: the next bump takes it
    assert guard.marker(SESSION) == 2


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")


@as_root
def test_a_root_bump_carries_no_setuid_setgid_sticky_or_others_write_bit(tmp_path: Path) -> None:
    """An earlier owner's CMD leaves a setuid copy of `id` (and setgid, sticky, world-writable
    modes) in its generation: a root bump copied it as a root-owned setuid program, run as root by
    anyone, and a 0777 directory as root's that anyone may write."""
    root = tmp_path / "home"
    os.chmod(tmp_path, 0o755)  # nobody may reach the copy, to run it
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    gen = guards.dir_write_path(root, 1)
    (gen / "id").write_bytes(Path("/usr/bin/id").read_bytes())
    os.chown(gen / "id", NOBODY, NOBODY)
    os.chmod(gen / "id", 0o6777)
    (gen / "shared").mkdir()
    os.chmod(gen / "shared", 0o3777)
    os.chmod(gen, 0o2755)
    guard.bump(SESSION, 2)
    copied = guards.dir_write_path(root, 2)
    ran = subprocess.run([*DROP, str(copied / "id"), "-u"], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == str(NOBODY), "the copy ran with its owner's (root's) privileges"
    assert stat.S_IMODE((copied / "id").stat().st_mode) == 0o755
    for path in (copied, copied / "shared"):
        assert stat.S_IMODE(path.lstat().st_mode) == 0o755, f"{path}: {path.lstat().st_mode:o}"


@as_root
def test_a_dir_guard_at_another_users_link_or_directory_is_refused_writing_nothing(tmp_path: Path) -> None:
    """Another user plants `S -> victim` in a sticky directory both may write: a root bump made
    `.lock`, `gen-1/` and `current` in the victim. Their directory, or one in a directory others
    may change, is refused likewise, and nothing is made on the way."""
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "S").symlink_to(victim)
    os.lchown(shared / "S", NOBODY, NOBODY)  # the other user's link
    with pytest.raises(GuardError, match="is a link"):
        guards.open_guard(f"dir://{shared}/S").bump(SESSION, 1)
    guard = guards.open_guard(f"dir://{shared}/R")  # missing yet: checked, and made at the bump
    (shared / "R").symlink_to(victim)
    os.lchown(shared / "R", NOBODY, NOBODY)  # planted once the run had checked
    with pytest.raises(GuardError, match="is a link"):
        guard.bump(SESSION, 1)
    assert list(victim.iterdir()) == [], "nothing was written through the links"
    (shared / "T").mkdir()
    os.chown(shared / "T", NOBODY, NOBODY)  # the other user's directory
    with pytest.raises(GuardError, match="this user's alone"):
        guards.open_guard(f"dir://{shared}/T")
    assert list((shared / "T").iterdir()) == []
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)  # not sticky: another user could swap what is made in it
    with pytest.raises(GuardError, match="others may write it"):  # before the Acquire, as the bump would
        guards.open_guard(f"dir://{open_to_all}/home/S")
    assert list(open_to_all.iterdir()) == [], "nothing was made in it"


@as_root
def test_a_missing_dir_guard_the_bump_would_refuse_is_refused_before_the_acquire(tmp_path: Path) -> None:
    """`dir:///home/<another user>/missing/g`: accepted before the Acquire, and refused only at the
    bump, after the grant had ended the previous owner. The deepest directory of the path that
    exists is checked as the bump will check it; nothing is made."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(GuardError, match="this user's alone"):
        guards.open_guard(f"dir://{theirs}/missing/g")
    with pytest.raises(GuardError, match="this user's alone"):
        guards.open_guard(f"dir://{theirs}/g")
    assert list(theirs.iterdir()) == []
    guards.open_guard(f"dir://{tmp_path}/mine/missing/g")  # a path the bump would make is taken


def test_a_dir_guard_through_a_link_in_a_directory_others_may_change_is_refused(tmp_path: Path) -> None:
    """This user's own link `l` in a directory any user may write (no sticky bit): the guard was
    checked where `l` led, then another user swapped `l` and CMD, writing under dir_write_path by
    the path, wrote through theirs. Refused before the Acquire, and at the bump; nothing made."""
    area, shared = tmp_path / "area", tmp_path / "shared"
    area.mkdir(mode=0o700)
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "l").symlink_to(area)
    with pytest.raises(GuardError, match="is a link in a directory another user may change"):
        guards.open_guard(f"dir://{shared}/l/guard")
    os.chmod(shared, 0o755)
    guard = guards.open_guard(f"dir://{shared}/l/guard")  # checked, then the directory is opened up
    os.chmod(shared, 0o777)
    with pytest.raises(GuardError, match="is a link in a directory another user may change"):
        guard.bump(SESSION, 1)
    assert list(area.iterdir()) == [], "nothing made through the link"


def test_a_dir_guard_is_made_by_its_first_bump_not_when_opened(tmp_path: Path) -> None:
    """A run opens its guards before the Acquire: a run refused then has made nothing."""
    guard = guards.open_guard(f"dir://{tmp_path}/a/b/home")
    assert guard.marker(SESSION) == 0
    assert list(tmp_path.iterdir()) == []
    guard.bump(SESSION, 1)
    assert guards.dir_write_path(tmp_path / "a" / "b" / "home", 1).is_dir()


def test_a_dir_guard_skips_a_fifo_or_socket_saying_which(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """An earlier owner leaves a FIFO or a socket in its generation: every later bump failed
    (EINVAL), each leaving its `.gen-N.staging` behind."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    gen = guards.dir_write_path(root, 1)
    os.mkfifo(gen / "a pipe")
    (gen / "d").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(gen / "d" / "sock"))
    (gen / "kept").write_text("kept")
    guard.bump(SESSION, 2)
    guard.bump(SESSION, 3)
    assert sorted(p.name for p in (root / "current").rglob("*")) == ["d", "kept"]
    said = capfd.readouterr().err
    assert "'a pipe' (a FIFO)" in said and "'d/sock' (a socket)" in said and "not copied into gen-2" in said
    assert sorted(p.name for p in root.iterdir()) == [".lock", "current", "gen-1", "gen-2", "gen-3"]


def test_a_failed_bump_leaves_no_staging_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory swapped for a link after it was listed fails the copy: its half-made
    `.gen-N.staging` stayed, one more copy's worth of disk at each failed bump."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    (guards.dir_write_path(root, 1) / "a").write_text("copied before the failure")
    (guards.dir_write_path(root, 1) / "d").mkdir()
    (guards.dir_write_path(root, 1) / "z").write_text("copied as d is swapped")
    copy_file = files._copy_file

    def swapped_then_copied(src: int, dst: int, name: str, st: os.stat_result,
                            left: int) -> tuple[int, os.stat_result]:
        if name == "z":  # another writer of this user's, after copy_tree listed `d` as a directory
            os.rename(root / "gen-1" / "d", tmp_path / "d-moved")
            (root / "gen-1" / "d").symlink_to(tmp_path)
        return copy_file(src, dst, name, st, left)

    monkeypatch.setattr(files, "_copy_file", swapped_then_copied)
    with pytest.raises(OSError):
        guard.bump(SESSION, 2)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "current", "gen-1"]


def test_a_bump_copies_a_generation_its_writer_still_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The previous owner, superseded but not yet stopped, still saves in its generation (a
    temporary file written then renamed over its state) while the new owner's bump copies it: a
    name gone between the listing and its lstat or open, or renamed over after its lstat, failed
    the whole bump (5 bumps in 100 beside such a writer), and the new CMD never ran. Each swap is
    made for real on disk at the point the writer would make it."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    gen = guards.dir_write_path(root, 1)
    for name in ("gone-listed", "gone-opened", "piped", "state.json"):
        (gen / name).write_text(f"old {name}")
    (gen / "sub").mkdir()
    (gen / "sub" / "f").write_text("in a directory removed once listed")
    (tmp_path / "state.json.tmp").write_text("new state")
    os.mkfifo(tmp_path / "fifo")
    real_listdir, real_open_listed, real_open_beneath = os.listdir, files.open_listed, files.open_beneath

    def listdir_then_remove(path: Any = ".") -> list[str]:
        found = real_listdir(path)
        if "gone-listed" in found and (gen / "gone-listed").exists():
            (gen / "gone-listed").unlink()  # after the listing, before its lstat
        return found

    def changed_then_opened(name: str, directory: int | None, listed: os.stat_result) -> int:
        if name == "gone-opened" and (gen / name).exists():
            (gen / name).unlink()
        elif name == "state.json" and (tmp_path / "state.json.tmp").exists():
            os.replace(tmp_path / "state.json.tmp", gen / name)  # a save by rename
        elif name == "piped" and (tmp_path / "fifo").exists():
            os.replace(tmp_path / "fifo", gen / name)
        return real_open_listed(name, directory, listed)

    def removed_then_opened(top: int, parts: list[str]) -> int:
        if parts == ["sub"] and (gen / "sub").exists() and os.path.samestat(os.fstat(top), os.stat(gen)):
            (gen / "sub" / "f").unlink()
            (gen / "sub").rmdir()
        return real_open_beneath(top, parts)

    monkeypatch.setattr(os, "listdir", listdir_then_remove)
    monkeypatch.setattr(files, "open_listed", changed_then_opened)
    monkeypatch.setattr(files, "open_beneath", removed_then_opened)
    guard.bump(SESSION, 2)
    monkeypatch.undo()
    copied = guards.dir_write_path(root, 2)
    assert sorted(p.name for p in copied.iterdir()) == ["state.json", "sub"]
    assert (copied / "state.json").read_text() == "new state" and list((copied / "sub").iterdir()) == []
    said = capfd.readouterr().err
    assert "not copied into gen-2" in said and "'piped' (replaced by a FIFO while copied)" in said
    assert "gone" not in said  # a name gone is not the user's concern: what is there is copied


def test_a_dir_guard_copies_holes_and_hard_links_as_such_within_a_cap(tmp_path: Path) -> None:
    """A 4 KB generation — a 200 MB sparse file and 4 more links to it — copied as 1 GB of zeros."""
    root = tmp_path / "home"
    guard = guards.open_guard(f"dir://{root}")
    guard.bump(SESSION, 1)
    gen = guards.dir_write_path(root, 1)
    with open(gen / "sparse", "wb") as f:
        f.truncate(200 << 20)
        f.seek(100 << 20)
        f.write(b"data in the middle")
    for i in range(4):
        os.link(gen / "sparse", gen / f"hard{i}")
    guard.bump(SESSION, 2)
    copied = guards.dir_write_path(root, 2)
    inodes = {(copied / name).stat().st_ino for name in ["sparse", "hard0", "hard1", "hard2", "hard3"]}
    assert len(inodes) == 1 and (copied / "sparse").stat().st_nlink == 5
    st = (copied / "sparse").stat()
    assert st.st_size == 200 << 20 and st.st_blocks * 512 <= 1 << 20, f"{st.st_blocks * 512} bytes on disk"
    with open(copied / "hard3", "rb") as f:
        f.seek(100 << 20)
        assert f.read(18) == b"data in the middle"
    capped = guards.open_guard(f"dir://{root}?cap_bytes=10")
    with pytest.raises(GuardError, match=r"gen-2 holds more than 10 bytes of data.*cap_bytes=N.*remove what"):
        capped.bump(SESSION, 3)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "current", "gen-1", "gen-2"]
    assert capped.marker(SESSION) == 2


HOLDFAST = os.path.join(os.path.dirname(sys.executable), "holdfast")


@as_root
def test_a_sqlite_guard_at_another_users_link_writes_nothing_before_the_acquire(tmp_path: Path) -> None:
    """Another user's links in their directory, `pub/db` to root's empty file and `pub/new` to a
    name in root's directory: `run --guard sqlite://…` as root, refused (69) for want of a
    coordinator, had made root's file a database, and made the missing one. Refused for the
    guard, before anything is asked; nothing written."""
    pub, rootonly = tmp_path / "pub", tmp_path / "rootonly"
    rootonly.mkdir(mode=0o700)
    (rootonly / "pwned.db").write_bytes(b"")
    pub.mkdir()
    (pub / "db").symlink_to(rootonly / "pwned.db")
    (pub / "new").symlink_to(rootonly / "made.db")
    for path in (pub, pub / "db", pub / "new"):
        os.lchown(path, NOBODY, NOBODY)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HOLDFAST_COORDINATOR": "127.0.0.1:9"}
    for name in ("db", "new"):
        run = [HOLDFAST, "run", "--session", "sessabcdef12", "--guard", f"sqlite://{pub / name}", "--", "id"]
        done = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 69, done.stderr
        assert "GUARD_UNREACHABLE" in done.stderr and "this user's alone" in done.stderr, done.stderr
    assert os.listdir(rootonly) == ["pwned.db"] and (rootonly / "pwned.db").read_bytes() == b""


@as_root
def test_a_sqlite_guard_takes_only_a_database_of_this_users_alone_never_a_link(tmp_path: Path) -> None:
    """The dir:// rules for the database's directory and the database itself: a link at its name
    (even this user's: SQLite follows it wherever it leads), a database another user owns, or one
    in a directory others may write, is refused before the Acquire, nothing written."""
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "link.db").symlink_to(victim)
    with pytest.raises(GuardError, match="is a link"):
        guards.open_guard(f"sqlite://{mine}/link.db")
    sqlite3.connect(mine / "theirs.db").close()
    os.chown(mine / "theirs.db", NOBODY, NOBODY)
    with pytest.raises(GuardError, match="alone"):
        guards.open_guard(f"sqlite://{mine}/theirs.db")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(GuardError, match="only it may write"):
        guards.open_guard(f"sqlite://{shared}/app.db")
    assert victim.read_bytes() == b"" and os.listdir(shared) == []
    assert sorted(os.listdir(mine)) == ["link.db", "theirs.db"]


def test_a_sqlite_guard_writes_nothing_until_its_bump(tmp_path: Path) -> None:
    """A run opens its guards before the Acquire: the database was made, and the marker table
    made in an existing one, then — by a run refused HELD too. Made by the first bump, 0600."""
    missing = guards.open_guard(f"sqlite://{tmp_path}/new.db")
    assert missing.marker(SESSION) == 0 and list(tmp_path.iterdir()) == []
    app = tmp_path / "app.db"
    with sqlite3.connect(app) as conn:
        conn.execute("CREATE TABLE app (v TEXT)")
    conn.close()
    before = app.read_bytes()
    existing = guards.open_guard(f"sqlite://{app}")
    try:
        assert existing.marker(SESSION) == 0
        assert app.read_bytes() == before, "no marker table made before a grant"
        for guard in (missing, existing):
            guard.bump(SESSION, 1)
            assert guard.marker(SESSION) == 1
        assert stat.S_IMODE((tmp_path / "new.db").stat().st_mode) == 0o600
    finally:
        missing.close()
        existing.close()


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_sqlite_writes_through_no_link_at_its_journal(journal: str, tmp_path: Path) -> None:
    """SQLite's own -journal and -wal files, made beside the database by name: a link planted at
    either is refused by SQLite itself (it opens them O_NOFOLLOW), never written through."""
    app, victim = tmp_path / "app.db", tmp_path / "victim"
    victim.write_bytes(b"kept")
    with sqlite3.connect(app) as conn:
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute("CREATE TABLE app (v TEXT)")
    conn.close()
    link = tmp_path / f"app.db-{'wal' if journal == 'wal' else 'journal'}"
    link.symlink_to(victim)
    guard = guards.open_guard(f"sqlite://{app}")
    try:
        with pytest.raises(sqlite3.OperationalError, match="unable to open"):
            guard.bump(SESSION, 1)
    finally:
        guard.close()
    assert victim.read_bytes() == b"kept" and link.is_symlink()
