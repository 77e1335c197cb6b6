"""Files and places another user controls, met by a root `run` on its own host: a FIFO renamed over
a file between its lstat and its open is never waited on (pack, and copy_tree for a dir guard's
bump), and a restore's holder of the previous tree swapped for a link moves nothing through it.
Each swap is made for real on disk, at the very point the other user would make it."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.client import acquire, carry, carry_restore
from holdfast.client.errors import ClientError
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.common import files
from holdfast.v1 import coordinator_pb2 as pb


def finishes(work: Callable[[], None], fifo: Path) -> list[BaseException]:
    """Runs `work` on a thread; what it raised, once it returned within 5 s. Else the FIFO it is
    stuck opening is given a writer (so the thread ends) and the test fails."""
    raised: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test
            raised.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(5):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        done.wait(5)
        pytest.fail(f"blocked opening the FIFO at {fifo}")
    return raised


def test_pack_never_opens_a_fifo_swapped_in_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0o777 directory in a carried root (carried modes are restored): another user renames a
    FIFO over a file between the walk's lstat and the read's open; the open waited for a writer
    forever and a root `run` never released."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    listed = carry._listed

    def then_swapped(directory: int) -> carry.Listed:
        found = listed(directory)
        os.rename(tmp_path / "fifo", root / "f")  # the other user, after the lstat
        return found

    monkeypatch.setattr(carry, "_listed", then_swapped)
    raised = finishes(lambda: carry.pack(["notes"], str(tmp_path), "sess-fifo-01"), root / "f")
    assert len(raised) == 1 and isinstance(raised[0], ClientError), raised
    assert "notes/f was replaced by something else while it was read" in raised[0].message


def test_pack_reads_no_other_file_renamed_over_a_root_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file root: another regular file renamed over it after the lstat is not the one listed."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "theirs").write_text("theirs")
    real_stat = carry.os.stat

    def stat_then_swap(*args: object, **kwargs: object) -> os.stat_result:
        found = real_stat(*args, **kwargs)  # type: ignore[arg-type]
        if args[0] == "notes.txt" or str(args[0]).endswith("/notes.txt"):
            os.rename(tmp_path / "theirs", tmp_path / "notes.txt")
        return found

    monkeypatch.setattr(carry.os, "stat", stat_then_swap)
    with pytest.raises(ClientError, match=r"notes\.txt was replaced by something else"):
        carry.pack(["notes.txt"], str(tmp_path), "sess-fifo-02")


def test_copy_tree_never_opens_a_fifo_swapped_in_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dir guard's bump copies a generation a stale writer may still change: the same window in
    copy_tree."""
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    (source / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    copy_file = files._copy_file

    def swapped_then_copied(src: int, dst: int, name: str, st: os.stat_result,
                            left: int) -> tuple[int, os.stat_result]:
        os.rename(tmp_path / "fifo", source / name)  # the other writer, after copy_tree's lstat
        return copy_file(src, dst, name, st, left)

    monkeypatch.setattr(files, "_copy_file", swapped_then_copied)
    skipped: list[list[str]] = []
    src, dst = os.open(source, os.O_RDONLY), os.open(target, os.O_RDONLY)
    try:
        raised = finishes(lambda: skipped.append(files.copy_tree(src, dst, 1 << 20)), source / "f")
    finally:
        os.close(src)
        os.close(dst)
    assert raised == [] and skipped == [["'f' (replaced by a FIFO while copied)"]]  # left out, saying so
    assert list(target.iterdir()) == []


def test_put_in_place_moves_nothing_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root in a directory others may write without the sticky bit: the holder of the previous
    tree is swapped for a link right after it is made, and the rename of the previous tree into
    it by name followed the link, moving it outside the root's directory."""
    shared, outside = tmp_path / "project", tmp_path / "outside"
    shared.mkdir()
    os.chmod(shared, 0o777)
    outside.mkdir()
    (shared / "notes").mkdir()
    (shared / "notes" / "mine").write_text("previous state")
    manifest = pb.CarryManifest(session_id="sess-old-01", fence=1, written_at_unix_ms=1)
    manifest.roots.add(path="notes", kind="dir")
    manifest.entries.add(root=0, path="", kind="dir", mode=0o755)
    made = files.make_dir

    def swapped(parent: int, prefix: str) -> str:
        name = made(parent, prefix)
        if "-old-" in prefix:  # the other user, right after it is made
            os.rename(name, name + ".x", src_dir_fd=parent, dst_dir_fd=parent)
            os.symlink(outside, name, dir_fd=parent)
        return name

    monkeypatch.setattr(files, "make_dir", swapped)
    with pytest.raises(ClientError, match="putting notes in place"):
        carry_restore.restore(manifest, b"", ["notes"], str(shared))
    assert os.listdir(outside) == []
    assert (shared / "notes" / "mine").read_text() == "previous state"


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
NOBODY = 65534
HOLDFAST = os.path.join(os.path.dirname(sys.executable), "holdfast")


def another_users_home(tmp_path: Path, links: dict[str, Path]) -> Path:
    """A home of uid 65534's with its links `name -> target`, theirs, as they would make them."""
    home = tmp_path / "theirhome"
    home.mkdir()
    for name, target in links.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(target)
        os.lchown(home / name, NOBODY, NOBODY)
    for path in [home, *(p for p in home.rglob("*") if not p.is_symlink())]:
        os.lchown(path, NOBODY, NOBODY)
    return home


@as_root
def test_a_takeover_id_is_kept_through_no_link_of_another_users_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root with another user's HOME (sudo without -H): their `~/.local/state` link to a directory
    of root's took root's takeover id, made there as root's."""
    rootonly = tmp_path / "rootonly"
    rootonly.mkdir(mode=0o700)
    home = another_users_home(tmp_path, {".local/state": rootonly})
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    operation, kept = acquire.takeover_operation("sess-abcdefgh", "host-a")
    assert list(rootonly.iterdir()) == [], "nothing made through their link"
    assert kept is not None and kept.is_relative_to(tmp_path / "tmp"), kept
    assert kept.read_text() == operation
    assert acquire.takeover_operation("sess-abcdefgh", "host-a") == (operation, kept), "kept for the retry"


@as_root
def test_a_restore_follows_no_link_in_another_users_home(tmp_path: Path) -> None:
    """Root `holdfast codex` with another user's HOME: their `~/.codex` link to root's directory
    was followed, and root's `sessions/` there replaced by the carried tree."""
    (tmp_path / "src" / "sessions").mkdir(parents=True)
    (tmp_path / "src" / "sessions" / "planted").write_text("the previous owner's")
    packed = carry.pack(["sessions"], str(tmp_path / "src"), "sess-abcdefgh")
    victim = tmp_path / "victim"
    (victim / "sessions").mkdir(parents=True, mode=0o700)
    (victim / "sessions" / "roots").write_text("root's")
    home = another_users_home(tmp_path, {".codex": victim})
    carried = str(home / ".codex" / "sessions")
    packed.manifest.roots[0].path = carried
    with pytest.raises(ClientError, match="uid 65534, neither yours nor root's"):
        carry_restore.restore(packed.manifest, b"".join(packed.chunks), [carried], "/")
    assert os.listdir(victim / "sessions") == ["roots"] and os.listdir(victim) == ["sessions"]


@as_root
def test_a_provider_command_refuses_a_state_directory_in_another_users_home(tmp_path: Path) -> None:
    """`holdfast codex` as root with another user's HOME made `~/.codex` through their link, then
    carried and restored there. Refused (2) before anything is made or asked."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    home = another_users_home(tmp_path, {".codex": victim})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    (bin_dir / "codex").chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([HOLDFAST, "codex", "--session", "sess-abcdefgh", "--coordinator", "127.0.0.1:9",
                           "--", "hi"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "theirhome: uid 65534 owns it" in done.stderr and "nothing was made" in done.stderr
    assert list(victim.iterdir()) == [] and not (tmp_path / "ran").exists()


@as_root
def test_certs_are_written_into_no_directory_or_link_of_another_user(tmp_path: Path) -> None:
    """`holdfast certs issue --out DIR` into another user's directory wrote root's certificate and
    the CA's through the links they had planted at the names (dangling, so `exists()` said no)."""
    ca, victim, out = tmp_path / "ca", tmp_path / "victim", tmp_path / "out"
    victim.mkdir(mode=0o700)
    made = subprocess.run([HOLDFAST, "certs", "init", str(ca)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    out.mkdir()
    os.chmod(out, 0o777)
    for name in ("ca.pem", "agent-node-7.pem", "agent-node-7.key"):
        (out / name).symlink_to(victim / name)
    for path in (out, *out.iterdir()):
        os.lchown(path, NOBODY, NOBODY)
    issue = [HOLDFAST, "certs", "issue", str(ca), "--role", "agent", "--host", "node-7", "--out"]
    done = subprocess.run([*issue, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "nothing was written" in done.stdout, done.stdout + done.stderr
    theirs = another_users_home(tmp_path, {"pki": victim})
    done = subprocess.run([HOLDFAST, "certs", "init", str(theirs / "pki")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "nothing was written" in done.stdout, done.stdout + done.stderr
    assert list(victim.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == [
        "agent-node-7.key", "agent-node-7.pem", "ca.pem"]
    os.chmod(out, 0o755)
    os.chown(out, 0, 0)  # root's alone now, a link of theirs left at the key's name: replaced
    (out / "agent-node-7.pem").unlink()
    done = subprocess.run([*issue, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(victim.iterdir()) == []
    assert not (out / "agent-node-7.key").is_symlink() and not (out / "agent-node-7.pem").is_symlink()


def test_what_holdfast_makes_it_never_refuses_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 000 (or 002 with a shared group) the missing parents were made 0o777 less the
    umask, and check_ancestors then refused them: a dir:// guard passed before the Acquire and its
    bump was refused after it. Every directory made is 0o755 at most, checked again as made."""
    before = os.umask(0)
    try:
        for umask in (0o000, 0o002):
            os.umask(umask)
            top = tmp_path / f"u{umask:o}"
            fd = files.open_private_path(top / "a" / "b", mode=0o777)
            try:
                files.check_ancestors(fd, str(top / "a" / "b"))
            finally:
                os.close(fd)
            fd, made = files.open_user_dir(top / "c" / "d", make=True)
            os.close(fd)
            assert made == [str(top / "c"), str(top / "c" / "d")]
            for path in (top, top / "a", top / "a" / "b", top / "c", top / "c" / "d"):
                assert path.stat().st_mode & 0o777 == 0o755, path
    finally:
        os.umask(before)


def test_a_hard_linked_link_is_not_followed(tmp_path: Path) -> None:
    """Where fs.protected_hardlinks is 0 another user may hard-link root's own link (`/var/run`)
    into a sticky directory: it reads as root's, but where it stands is their choice. A link with
    a second name is refused, nothing made where it leads."""
    sticky, elsewhere, own = tmp_path / "sticky", tmp_path / "elsewhere", tmp_path / "own"
    sticky.mkdir()
    sticky.chmod(0o1777)
    elsewhere.mkdir()
    own.mkdir()
    (own / "l").symlink_to(elsewhere)
    os.link(own / "l", sticky / "hl", follow_symlinks=False)  # the link itself, not where it leads
    with pytest.raises(files.UntrustedLink, match="2 names") as refused:
        files.open_user_dir(sticky / "hl" / "a", make=True)
    assert refused.value.filename == str(sticky / "hl")
    with pytest.raises(files.UntrustedLink, match="hard-linked"):
        files.open_private_path(sticky / "hl" / "state")
    assert list(elsewhere.iterdir()) == [], "nothing made through the link"
    (own / "l").unlink()  # one name again: this user's own link, followed
    os.close(files.open_private_path(sticky / "hl" / "state"))
    assert (elsewhere / "state").is_dir()


@as_root
def test_a_system_groups_write_is_never_taken_for_this_users(tmp_path: Path) -> None:
    """Root's 0775 root:root directory: by /etc/passwd and /etc/group gid 0 held nobody but root,
    but the kernel lets any process hold gid 0 unlisted (`--user 4322:0`, OpenShift): it could
    rename the state directory away and a link into its place. Refused, nothing made."""
    g0 = tmp_path / "g0"
    g0.mkdir()
    g0.chmod(0o775)
    with pytest.raises(files.Swappable, match="group 0, a system group") as refused:
        files.open_private_path(g0 / "state")
    assert refused.value.filename == str(g0)
    assert list(g0.iterdir()) == []


def a_regular_user_with_a_private_group() -> tuple[int, int] | None:
    """(uid, gid) of a user listed with a gid of its own (user-private, umask 002's), if any."""
    users = pwd.getpwall()
    for user in users:
        try:
            members = grp.getgrgid(user.pw_gid).gr_mem
        except KeyError:
            continue
        if (user.pw_uid >= 1000 and user.pw_gid >= 1000 and set(members) <= {user.pw_name}
                and all(other.pw_uid == user.pw_uid for other in users if other.pw_gid == user.pw_gid)):
            return user.pw_uid, user.pw_gid
    return None


@pytest.mark.skipif(os.geteuid() != 0 or a_regular_user_with_a_private_group() is None,
                    reason="a regular user with a private group, run as them by root")
def test_umask_002_under_a_users_private_group_still_works() -> None:
    """Fedora and RHEL give regular users umask 002 and a group of their own: their directories are
    group-writable for it. A state directory beneath one is still theirs, and what is made there
    is 0o755 at most."""
    uid, gid = a_regular_user_with_a_private_group() or (0, 0)
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        home = Path(top) / "home"
        home.mkdir()
        os.chown(home, uid, gid)
        home.chmod(0o775)
        script = ("import os, sys\nfrom holdfast.common import files\n"
                  "os.close(files.open_private_path(sys.argv[1]))\n")
        done = subprocess.run([sys.executable, "-c", script, str(home / "work" / "state")], user=uid,
                              group=gid, extra_groups=[], umask=0o002, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert (home / "work").stat().st_mode & 0o777 == 0o755
        assert (home / "work" / "state").stat().st_mode & 0o777 == 0o755


@as_root
def test_the_overflow_uid_in_a_user_namespace_trusts_no_owner(tmp_path: Path) -> None:
    """Running as uid 65534 in a user namespace, every unmapped owner reads as 65534 too: another
    user's link in a sticky directory passed as this user's own and `certs init` wrote the CA
    where it led. Refused, saying why, nothing written."""
    as_overflow = ["unshare", "-U", "--map-user=65534", "--map-group=65534"]
    if subprocess.run([*as_overflow, "true"]).returncode:
        pytest.skip("no user namespace here")
    sticky, victim = tmp_path / "sticky", tmp_path / "victim"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim.mkdir(mode=0o700)
    (sticky / "state").symlink_to(victim)
    os.lchown(sticky / "state", 4321, 4321)  # a user the namespace does not map
    done = subprocess.run([*as_overflow, HOLDFAST, "certs", "init", str(sticky / "state" / "ca")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the kernel's overflow uid, in a user namespace" in done.stdout and "Next:" in done.stdout
    assert list(victim.iterdir()) == []


def another_users_link(tmp_path: Path) -> tuple[Path, Path]:
    """(`sticky/theirs`, the directory of root's alone it leads to): uid 65534's link in a sticky
    directory any user may write, as /tmp."""
    sticky, victim = tmp_path / "sticky", tmp_path / "rootonly"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim.mkdir(mode=0o700)
    (sticky / "theirs").symlink_to(victim)
    os.lchown(sticky / "theirs", NOBODY, NOBODY)
    return sticky / "theirs", victim


@as_root
def test_a_servers_ready_file_goes_through_no_link_of_another_user(tmp_path: Path) -> None:
    """`agent serve --ready-file /tmp/theirs/agent.ready` as root wrote the ready file where their
    link led: the directory was opened by its path. Refused, naming the link; nothing written."""
    theirs, victim = another_users_link(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run([HOLDFAST, "agent", "serve", "--listen", "127.0.0.1:0", "--host-id", "node-review",
                           "--ready-file", str(theirs / "agent.ready")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "cannot write the ready file" in done.stderr and "neither yours nor root's" in done.stderr
    assert list(victim.iterdir()) == []


@as_root
def test_enrolled_credentials_are_written_through_no_link_of_another_user(tmp_path: Path) -> None:
    """An agent's or a session's TLS directory through another user's link: the agent's key and
    certificates, and a session's `.enroll.lock`, were written where it led. Refused before
    anything is asked of the issuer; a lock another user planted in a shared TLS directory too."""
    from holdfast.agent import enroll
    from holdfast.client.enrollment import LOCK_FILE, Enroller

    theirs, victim = another_users_link(tmp_path)
    creds = enroll.Credentials(b"KEY", b"CERT", b"BUNDLE")
    with pytest.raises(files.UntrustedLink, match="neither yours nor root's"):
        enroll.write(theirs / "agent-tls", "node-1", creds)

    def renew(tls_dir: Path) -> None:
        enroller = Enroller("127.0.0.1:9", tmp_path / "ca.pem", tmp_path / "token", tls_dir, "node-1")
        asyncio.run(enroller.renew())

    with pytest.raises(ClientError, match="neither yours nor root's"):
        renew(theirs / "pod-tls")
    assert list(victim.iterdir()) == []
    shared = tmp_path / "sticky" / "shared-tls"  # a pod's emptyDir, any user's to write
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / LOCK_FILE).write_bytes(b"")
    os.chown(shared / LOCK_FILE, NOBODY, NOBODY)  # theirs to flock for ever
    with pytest.raises(ClientError, match="owner uid 65534"):
        renew(shared)
    made = tmp_path / "mine" / "agent-tls"
    assert enroll.write(made, "node-1", creds) == made / "agent-node-1.pem"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and (made / "agent-node-1.key").read_bytes() == b"KEY"


def another_runs_grant_dir(tmp_path: Path) -> Path:
    """Another run's grant directory, root's 0700, holding its 0600 grant file as `run` writes it."""
    other = tmp_path / "other-run"
    other.mkdir(mode=0o700)
    held = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
    try:
        Grant("sess-hostile-other", 1, "secret", "token", "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:1").write(held)
    finally:
        os.close(held)
    return other


@as_root
def test_a_grant_file_is_read_through_no_link_of_another_user(tmp_path: Path) -> None:
    """CMD reads its grant file by its path: another user's link on the way, or one at the file,
    led it to another run's grant directory, where root's own 0600 file passed — and CMD wrote as
    that session's owner."""
    other = another_runs_grant_dir(tmp_path)
    home = another_users_home(tmp_path, {"run": other})
    with pytest.raises(files.UntrustedLink, match="is a link of uid 65534"):
        Grant.from_file(home / "run" / GRANT_FILE)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / GRANT_FILE).symlink_to(other / GRANT_FILE)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):  # O_NOFOLLOW, whoever's
        Grant.from_file(mine / GRANT_FILE)
    assert Grant.from_file(other / GRANT_FILE).session_id == "sess-hostile-other"


@as_root
def test_a_grant_file_is_read_only_from_a_directory_of_this_users_alone_and_by_its_only_name(
        tmp_path: Path) -> None:
    """Another user's directory put where the grant directory was, holding a hard link to another
    run's grant file (root's own 0600 file, where links to others' files are not protected), passed
    every check of the file itself."""
    other = another_runs_grant_dir(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.link(other / GRANT_FILE, theirs / GRANT_FILE)
    with pytest.raises(ValueError, match="2 names"):
        Grant.from_file(theirs / GRANT_FILE)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(ValueError, match="not in a directory of this user's alone"):
        Grant.from_file(theirs / GRANT_FILE)
    os.unlink(theirs / GRANT_FILE)
    assert Grant.from_file(other / GRANT_FILE).session_id == "sess-hostile-other"


def a_tls_dir(tmp_path: Path, mode: int) -> tuple[Path, Path]:
    """(a directory of `mode` holding root's client key, certificate and ca.pem, as `certs init`
    writes them; another CA's ca.pem, a rogue coordinator's, that a user other than root holds)."""
    from holdfast.common import certs

    made, rogue = tmp_path / "made", tmp_path / "rogue"
    certs.init_local(made, [], ["127.0.0.1"])
    certs.init_ca(rogue)
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    tls_dir.chmod(mode)
    for name in ("client.key", "client.pem", "ca.pem"):
        (tls_dir / name).write_bytes((made / name).read_bytes())
        (tls_dir / name).chmod(0o600 if name.endswith(".key") else 0o644)
    return tls_dir, rogue / "ca.pem"


def theirs(path: Path, data: bytes) -> None:
    """`data` at `path` as uid 65534 writes it: made beside it and renamed over it."""
    temp = path.with_name(".theirs")
    temp.write_bytes(data)
    os.chown(temp, NOBODY, NOBODY)
    temp.replace(path)


@as_root
def test_tls_material_another_user_put_in_its_directory_is_never_trusted(tmp_path: Path) -> None:
    """A sticky TLS directory others may add to: their CA bundle (agent-ca.pem), a link of theirs to
    it, a FIFO at session-ca.pem, were read by their paths — the client trusted their coordinator,
    or waited on the FIFO for ever. Refused, each naming the file; root's own link (a Kubernetes
    Secret's `..data`) is followed; a private key others may read is refused too."""
    from holdfast.common import reloading, tls

    tls_dir, rogue = a_tls_dir(tmp_path, 0o1777)
    role = tls.Role("client")
    good = tls.trust_bundle(tls_dir)
    theirs(tls_dir / "agent-ca.pem", rogue.read_bytes())
    with pytest.raises(files.UntrustedFile, match="uid 65534's, neither yours nor root's"):
        tls.trust_bundle(tls_dir)
    (tls_dir / "agent-ca.pem").unlink()
    (tls_dir / "agent-ca.pem").symlink_to(rogue)
    os.lchown(tls_dir / "agent-ca.pem", NOBODY, NOBODY)
    with pytest.raises(files.UntrustedLink, match="neither yours nor root's"):
        tls.channel_credentials(tls_dir, role)
    (tls_dir / "agent-ca.pem").unlink()
    os.mkfifo(tls_dir / "session-ca.pem")
    os.chown(tls_dir / "session-ca.pem", NOBODY, NOBODY)
    raised = finishes(lambda: tls.trust_bundle(tls_dir), tls_dir / "session-ca.pem")
    assert [type(exc) for exc in raised] == [files.UntrustedFile], raised
    (tls_dir / "session-ca.pem").unlink()
    data = tls_dir / "..data"  # a Secret volume's: root's links, in a directory only root writes
    data.mkdir()
    (data / "ca.pem").write_bytes((tls_dir / "ca.pem").read_bytes())
    (tls_dir / "ca.pem").unlink()
    (tls_dir / "ca.pem").symlink_to("..data/ca.pem")
    assert tls.trust_bundle(tls_dir) == good
    (tls_dir / "client.key").chmod(0o644)
    with pytest.raises(files.UntrustedFile, match="private key others may read"):
        reloading.read_material(tls_dir, role)


@as_root
def test_a_hard_link_to_roots_pem_in_a_tls_directory_is_never_trusted(tmp_path: Path) -> None:
    """Where fs.protected_hardlinks is 0 any user may hard-link root's 0644 PEM — another CA's — into
    a sticky TLS directory as agent-ca.pem: root's file, no one else may write it, and it was trusted.
    Made here by root standing in for that user; refused, naming the file and the fix."""
    from holdfast.common import tls

    tls_dir, rogue = a_tls_dir(tmp_path, 0o1777)
    os.link(rogue, tls_dir / "agent-ca.pem")
    with pytest.raises(files.UntrustedFile, match="another name links to it: copy it to its own file") as got:
        tls.trust_bundle(tls_dir)
    assert got.value.filename == str(tls_dir / "agent-ca.pem")


@as_root
def test_a_key_its_reader_may_not_read_names_its_path_and_the_mode_it_needs() -> None:
    """Root's 0600 coordinator key read as uid 65534 (a service user) stopped the server on a bare
    `PermissionError: 'client.key'`, naming neither its directory nor what to change."""
    from holdfast.common import tls
    from tests.unit.test_carry_rules import as_nobody

    box = Path(tempfile.mkdtemp(prefix="holdfast-tls-key-"))  # not tmp_path: nobody may not reach it
    try:
        box.chmod(0o755)
        tls_dir, _ = a_tls_dir(box, 0o755)
        key = tls_dir / "client.key"

        def read_key() -> None:
            needs = "root:<group> 0640 with uid 65534 in <group>"
            with pytest.raises(files.UntrustedFile, match=needs) as got:
                tls.read_files(tls_dir, tls.Role("client"))
            assert got.value.filename == str(key) and not isinstance(got.value, PermissionError)
        as_nobody(read_key)
    finally:
        shutil.rmtree(box)


@as_root
def test_a_reload_keeps_its_credentials_when_another_user_adds_to_the_directory(tmp_path: Path) -> None:
    """The agent's and coordinator's reload read the directory by path: another user's CA bundle
    there was trusted from the next handshake on, their FIFO blocked the reload for ever."""
    from holdfast.common import reloading, tls

    tls_dir, rogue = a_tls_dir(tmp_path, 0o1777)
    live = reloading.ReloadingCredentials(tls_dir, tls.Role("client"))
    before = live.material
    theirs(tls_dir / "session-ca.pem", rogue.read_bytes())
    assert not live.reload() and live.material == before
    (tls_dir / "session-ca.pem").unlink()
    os.mkfifo(tls_dir / "agent-ca.pem")
    os.chown(tls_dir / "agent-ca.pem", NOBODY, NOBODY)
    assert finishes(lambda: live.reload(), tls_dir / "agent-ca.pem") == []
    assert live.material == before


@as_root
def test_a_tls_directory_others_may_write_is_used_only_through_a_private_subdirectory(tmp_path: Path) -> None:
    """A 0777 TLS directory (a pod's emptyDir): another user may rename their ca.pem over root's
    there. What is in it is never read; an enrollment writes into `holdfast-0` (0700), read from
    there; one another user made at that name is refused."""
    from holdfast.agent import enroll
    from holdfast.common import reloading, tls

    tls_dir, rogue = a_tls_dir(tmp_path, 0o777)
    with pytest.raises(FileNotFoundError, match="subdirectory holdfast-0"):
        reloading.read_material(tls_dir, tls.Role("client"))
    key, cert, ca = ((tls_dir / name).read_bytes() for name in ("client.key", "client.pem", "ca.pem"))
    path = enroll.write(tls_dir, "node-1", enroll.Credentials(key, cert, ca))
    private = tls_dir / "holdfast-0"
    assert path == private / "agent-node-1.pem" and stat.S_IMODE(private.stat().st_mode) == 0o700
    theirs(tls_dir / "ca.pem", rogue.read_bytes())
    assert reloading.read_material(tls_dir, tls.Role("agent", "node-1")).trust_pem == ca
    for name in os.listdir(private):
        (private / name).unlink()
    private.rmdir()
    private.mkdir(mode=0o700)
    os.chown(private, NOBODY, NOBODY)
    with pytest.raises(files.NotPrivate, match="holdfast-0"):
        enroll.write(tls_dir, "node-1", enroll.Credentials(key, cert, ca))


@as_root
def test_an_enrolled_directory_is_made_in_no_directory_another_user_may_change(tmp_path: Path) -> None:
    """`open_enrolled_dir` made the missing directories of a TLS directory's path in another user's
    directory, where they could rename it away and put their own in its place. Refused; nothing made."""
    from holdfast.common import certs

    home = another_users_home(tmp_path, {})
    with pytest.raises(files.Swappable, match="uid 65534 owns it"):
        certs.open_enrolled_dir(home / "agent" / "tls")
    assert list(home.iterdir()) == []
