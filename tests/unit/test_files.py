"""Files written into directories others may write: a link planted at the name or beside it is
replaced, never written through; a private directory that is a link, another user's, or writable
by others is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from holdfast.common import dir_rules, files, upstate
from tests.acls import GROUP_OBJ, NO_ID, OTHER, USER_OBJ, acl, grant, named_user


def test_a_link_at_the_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("kept")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "report.json").symlink_to(victim)
    files.write_whole(shared, "report.json", b"{}\n", mode=0o644)
    assert victim.read_text() == "kept"
    assert not (shared / "report.json").is_symlink() and (shared / "report.json").read_bytes() == b"{}\n"
    assert (shared / "report.json").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in shared.iterdir()) == ["report.json"], "no temporary file left"


def test_up_json_is_written_whole_through_no_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / upstate.STATE_FILE).symlink_to(victim)
    upstate.write(tmp_path / "state", {"coordinator": "127.0.0.1:1"})
    assert not victim.exists()
    assert upstate.load(tmp_path / "state") == {"coordinator": "127.0.0.1:1"}


def test_up_json_is_read_through_no_link(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text('{"coordinator": "127.0.0.1:1"}')
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / upstate.STATE_FILE).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(upstate.NoStack):
        upstate.load(tmp_path / "state")


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory")
def test_the_cli_trusts_and_points_through_no_state_directory_of_another_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Their up.json would name a CA of theirs for the CLI to trust, their addresses/ which state
    directory serves an address: neither is read, and no word of ours is written there."""
    monkeypatch.delenv(upstate.STATE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    theirs = upstate.default_state_dir()
    theirs.mkdir(mode=0o755)
    (theirs / upstate.STATE_FILE).write_text('{"coordinator": "127.0.0.1:9", "tls_dir": "/their/ca"}')
    os.chown(theirs, 65534, 65534)
    assert upstate.tls_dir_for("127.0.0.1:9") is None
    with pytest.raises(files.NotPrivate):
        upstate.point(tmp_path / "ours", "127.0.0.1:9")
    assert sorted(p.name for p in theirs.iterdir()) == [upstate.STATE_FILE]


def test_a_private_tree_holds_no_link_and_nothing_others_may_write(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "etcd" / "member").mkdir(parents=True, mode=0o700)
    (top / "etcd" / "member" / "db").write_bytes(b"x")
    fd = files.open_private_dir(top)
    try:
        files.check_private_tree(fd, str(top))
        (top / "etcd" / "member" / "wal").symlink_to(tmp_path)
        with pytest.raises(files.NotPrivate) as linked:
            files.check_private_tree(fd, str(top))
        assert linked.value.filename == str(top / "etcd" / "member" / "wal")
        (top / "etcd" / "member" / "wal").unlink()
        (top / "etcd" / "member" / "db").chmod(0o666)
        with pytest.raises(files.NotPrivate, match="mode 666"):
            files.check_private_tree(fd, str(top))
        (top / "etcd" / "member" / "db").chmod(0o600)
        if os.geteuid() == 0:
            os.chown(top / "etcd", 65534, 65534)
            with pytest.raises(files.NotPrivate, match="owner uid 65534"):
                files.check_private_tree(fd, str(top))
    finally:
        os.close(fd)


def test_a_directory_another_user_may_change_above_a_private_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "open" / "state").mkdir(parents=True, mode=0o700)
    fd = files.open_private_dir(tmp_path / "open" / "state")
    try:
        files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        (tmp_path / "open").chmod(0o777)  # anybody could rename `state` away, a link in its place
        with pytest.raises(files.Swappable) as refused:
            files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        assert refused.value.filename == str(tmp_path / "open")
        (tmp_path / "open").chmod(0o1777)  # sticky, as /tmp: only the owner renames
        files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        (tmp_path / "open").chmod(0o775)  # this user's own group (umask 002's): this user's
        os.chown(tmp_path / "open", -1, os.getegid())
        if os.getegid() >= dir_rules.USER_GID_MIN:
            files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        else:  # gid 0 or a system group: others may hold it unlisted (test_hostile_files.py)
            with pytest.raises(files.Swappable, match="a system group"):
                files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        if os.geteuid() == 0:
            os.chown(tmp_path / "open", -1, 65534)  # another group's
            with pytest.raises(files.Swappable, match="mode 775"):
                files.check_ancestors(fd, str(tmp_path / "open" / "state"))
        if os.geteuid() == 0:
            os.chown(tmp_path / "open", 65534, 65534)
            with pytest.raises(files.Swappable, match="uid 65534 owns it"):
                files.check_ancestors(fd, str(tmp_path / "open" / "state"))
    finally:
        os.close(fd)


def swappable(mode: int, uid: int = 1000, gid: int = 1000, acl: bool = False,
              private: bool = True) -> str | None:
    return dir_rules.swappable_because("/d", 0o040000 | mode, uid, gid, euid=1000, egid=1000, acl=acl,
                                       group_private=private)


def test_only_a_group_that_holds_nobody_else_and_no_acl_makes_group_write_this_users() -> None:
    assert swappable(0o755) is None
    assert swappable(0o755, uid=0, gid=0) is None  # root's
    assert swappable(0o775) is None  # this user's private group: umask 002's
    assert "uid 1001 owns it" in str(swappable(0o755, uid=1001))
    assert "`chmod go-w /d`" in str(swappable(0o777))
    assert swappable(0o1777, uid=0, gid=0) is None  # sticky, as /tmp
    # The group bits are an ACL's mask: a named user may write, whoever the group is.
    assert "`setfacl -b /d` or `chmod g-w /d`" in str(swappable(0o775, acl=True))
    assert swappable(0o755, acl=True) is None  # a mask without w: no named entry may write
    assert swappable(0o1775, acl=True) is None
    assert "`chmod g-w /d`" in str(swappable(0o775, private=False))  # users, gid 100: shared
    assert "group 1001, not uid 1000's alone" in str(swappable(0o775, gid=1001))


def test_a_group_is_private_only_with_no_other_member_and_no_other_users_primary() -> None:
    users = [(0, 0), (1000, 1000), (1001, 100)]
    assert dir_rules.group_private(1000, [], "me", users, 1000)
    assert dir_rules.group_private(1000, ["me"], "me", users, 1000)
    assert not dir_rules.group_private(1000, ["me", "them"], "me", users, 1000)
    assert not dir_rules.group_private(100, [], "me", [*users, (1000, 100)], 1000)  # 1001's primary
    assert not dir_rules.group_private(1000, [], None, users, 1000)  # a user the database cannot name


def test_an_acl_lets_others_write_by_an_entry_the_mask_allows() -> None:
    assert dir_rules.acl_lets_others_write(named_user(1002))
    assert not dir_rules.acl_lets_others_write(named_user(1002, perm=0o5))
    assert not dir_rules.acl_lets_others_write(named_user(1002, mask=0o5))  # the mask limits it
    assert dir_rules.acl_lets_others_write(acl((USER_OBJ, 0o7, NO_ID), (GROUP_OBJ, 0o5, NO_ID),
                                               (OTHER, 0o7, NO_ID)))  # others', which no mask limits
    assert dir_rules.acl_lets_others_write(b"\x02\x00")  # unparsed: taken as letting them


def test_a_directory_above_with_an_acl_naming_another_user_is_refused(tmp_path: Path) -> None:
    """`setfacl -m u:1002:rwx` on a 0o755 directory of this user's own group: its group bits, now
    the ACL's mask, read 0o775 as umask 002's would, but uid 1002 may rename what is in it."""
    (tmp_path / "shared" / "state").mkdir(parents=True, mode=0o700)
    (tmp_path / "shared").chmod(0o755)
    os.chown(tmp_path / "shared", -1, os.getegid())
    fd = files.open_private_dir(tmp_path / "shared" / "state")
    try:
        grant(tmp_path / "shared", 1002)
        with pytest.raises(files.Swappable, match="ACL") as refused:
            files.check_ancestors(fd, str(tmp_path / "shared" / "state"))
        assert refused.value.filename == str(tmp_path / "shared")
        os.setxattr(tmp_path / "shared", dir_rules.ACL_ACCESS, named_user(1002, mask=0o5))  # mask r-x
        files.check_ancestors(fd, str(tmp_path / "shared" / "state"))
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="a group of the caller's that another user has as primary")
def test_a_directory_above_writable_by_a_group_another_user_has_is_refused(tmp_path: Path) -> None:
    """The caller's own gid, 65534, is also nobody's primary group: its group-write is not this
    user's alone, as a shared `users` (gid 100) group's is not."""
    (tmp_path / "shared" / "state").mkdir(parents=True, mode=0o700)
    (tmp_path / "shared").chmod(0o775)
    os.chown(tmp_path / "shared", -1, 65534)
    fd = files.open_private_dir(tmp_path / "shared" / "state")
    os.setegid(65534)
    try:
        with pytest.raises(files.Swappable, match="group 65534, not uid 0's alone") as refused:
            files.check_ancestors(fd, str(tmp_path / "shared" / "state"))
        assert refused.value.filename == str(tmp_path / "shared")
    finally:
        os.setegid(0)
        os.close(fd)


def test_a_private_tree_whose_acl_lets_another_user_write_is_refused(tmp_path: Path) -> None:
    """A named entry with w shows as the group's w (the mask); a default ACL gives one to what is
    made there later (etcd's files, logs), whatever the umask."""
    top = tmp_path / "top"
    (top / "etcd").mkdir(parents=True, mode=0o700)
    (top / "etcd").chmod(0o700)
    top.chmod(0o700)
    fd = files.open_private_dir(top)
    try:
        files.check_private_tree(fd, str(top))
        grant(top / "etcd", 1002)
        with pytest.raises(files.NotPrivate, match="mode 775"):
            files.check_private_tree(fd, str(top))
        os.removexattr(top / "etcd", dir_rules.ACL_ACCESS)
        (top / "etcd").chmod(0o700)
        grant(top / "etcd", 1002, default=True)
        with pytest.raises(files.NotPrivate, match="default ACL") as refused:
            files.check_private_tree(fd, str(top))
        assert refused.value.filename == str(top / "etcd")
        os.removexattr(top / "etcd", dir_rules.ACL_DEFAULT)
        grant(top, 1002, default=True)
        with pytest.raises(files.NotPrivate, match="default ACL") as refused:
            files.check_private_tree(fd, str(top))
        assert refused.value.filename == str(top)
    finally:
        os.close(fd)


def test_point_makes_the_default_state_directory_and_unpoint_removes_its_word(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(upstate.STATE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg" / "state"))  # neither made yet
    upstate.point(tmp_path / "ours", "127.0.0.1:9")
    assert upstate.pointed("127.0.0.1:9") == (tmp_path / "ours").resolve()
    upstate.unpoint(tmp_path / "elsewhere", "127.0.0.1:9")  # names another: kept
    assert upstate.pointed("127.0.0.1:9") == (tmp_path / "ours").resolve()
    upstate.unpoint(tmp_path / "ours", "127.0.0.1:9")
    assert upstate.pointed("127.0.0.1:9") is None


def test_a_private_path_is_not_made_where_it_would_inherit_a_default_acl_for_others(tmp_path: Path) -> None:
    """What is made in a directory with a default ACL naming uid 1002 gets its entries: a
    directory on the way (made 0o755: the mask r-x, so 1002 may not write it) takes the default
    on, and the last one has it for what is made in it. Refused naming that directory, before
    anything is made in it: its mtime (set in the past) shows a directory made and removed again,
    which a watcher of it sees meanwhile."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    grant(shared, 1002, default=True)
    os.utime(shared, ns=(1, 1))
    for path in (shared / "a" / "state", shared / "state"):
        with pytest.raises(files.NotPrivate, match="default ACL") as refused:
            files.open_private_path(path)
        assert refused.value.filename == str(shared)
        assert list(shared.iterdir()) == []
        assert shared.stat().st_mtime_ns == 1, f"{path}: nothing made in it, not even for a moment"
    os.removexattr(shared, dir_rules.ACL_DEFAULT)
    os.close(files.open_private_path(tmp_path / "shared" / "a" / "state"))


def test_a_private_path_is_checked_as_it_would_be_made_without_making_anything(tmp_path: Path) -> None:
    """What open_private_path would refuse — a path in a directory with a default ACL for others,
    one in a directory others may change — is refused without making anything, and one
    it may make is not made: a run checks before its Acquire what it makes only once granted."""
    (tmp_path / "shared").mkdir(mode=0o755)
    grant(tmp_path / "shared", 1002, default=True)
    with pytest.raises(files.NotPrivate, match="default ACL"):
        files.open_existing_private_path(tmp_path / "shared" / "a" / "state")
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(files.Swappable):
        files.open_existing_private_path(tmp_path / "open" / "a" / "state")
    assert files.open_existing_private_path(tmp_path / "a" / "state") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["open", "shared"]
    assert list((tmp_path / "shared").iterdir()) == list((tmp_path / "open").iterdir()) == []
    os.close(files.open_private_path(tmp_path / "a" / "state"))
    fd = files.open_existing_private_path(tmp_path / "a" / "state")
    assert fd is not None
    os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's home")
def test_point_makes_nothing_in_another_users_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root with another user's HOME (`su` without `-`): the default state directory lies in their
    directories, which they could swap for links; no directory or word of ours is made there."""
    home = tmp_path / "alice"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)
    monkeypatch.delenv(upstate.STATE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(files.Swappable, match="uid 65534 owns it") as refused:
        upstate.point(tmp_path / "ours", "127.0.0.1:9")
    assert refused.value.filename == str(home)
    assert list(home.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's home")
def test_unpoint_removes_nothing_through_another_users_link(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Their `addresses/` is a link to a directory of root's holding a file of the word's name,
    naming our state directory: it is kept, as nothing is removed through their directories."""
    ours, kept = tmp_path / "ours", tmp_path / "root-only"
    kept.mkdir(mode=0o700)
    (kept / "127.0.0.1_9.json").write_text(f'{{"state_dir": "{ours.resolve()}"}}')
    theirs = tmp_path / "alice" / ".local" / "state" / "holdfast"
    theirs.mkdir(parents=True, mode=0o755)
    (theirs / upstate.ADDRESSES_DIR).symlink_to(kept)
    for path in [tmp_path / "alice", *(tmp_path / "alice").rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    monkeypatch.delenv(upstate.STATE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "alice"))
    upstate.unpoint(ours, "127.0.0.1:9")
    assert [p.name for p in kept.iterdir()] == ["127.0.0.1_9.json"]


def test_a_private_file_is_opened_through_no_link_fifo_or_file_of_another(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(OSError):
        files.open_private_file(None, str(tmp_path / "log"), files.APPEND)
    os.mkfifo(tmp_path / "fifo")
    for flags in (files.APPEND, os.O_RDWR):  # at once: no reader nor writer is waited for
        with pytest.raises(OSError):
            files.open_private_file(None, str(tmp_path / "fifo"), flags)
    victim.chmod(0o646)
    with pytest.raises(files.NotPrivate):
        files.open_private_file(None, str(victim), files.APPEND)
    assert victim.read_bytes() == b"kept"
    victim.chmod(0o644)
    os.close(files.open_private_file(None, str(victim), files.APPEND))


def test_a_name_that_is_not_one_component_is_refused(tmp_path: Path) -> None:
    for name in ("a/b", "..", "", "."):
        with pytest.raises(ValueError):
            files.write_whole(tmp_path, name, b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_private_directory_is_ours_alone(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    os.close(files.open_private_dir(ours))
    (tmp_path / "link").symlink_to(ours)
    with pytest.raises(files.NotPrivate, match="is a link"):
        files.open_private_dir(tmp_path / "link")
    os.chmod(ours, 0o770)
    with pytest.raises(files.NotPrivate):
        files.open_private_dir(ours)
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(files.NotPrivate):
            files.open_private_dir(theirs)


def test_a_tree_is_removed_whatever_its_depth_and_modes_through_no_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "kept").mkdir(parents=True)
    top = tmp_path / "tree"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):  # deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    (top / "link").symlink_to(victim)
    (top / "sealed").mkdir()
    (top / "sealed" / "x").write_text("x")
    (top / "sealed").chmod(0o000)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.remove_tree(fd, "tree")  # also keeps pytest's recursive clean-up from meeting it
        files.remove_tree(fd, "tree")  # already gone: nothing to do
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]
    assert (victim / "kept").is_dir()


def test_a_long_name_is_written_whole(tmp_path: Path) -> None:
    """A --report named with 250 bytes: its temporary '.<name>.<hex>.tmp' was over NAME_MAX."""
    files.write_whole(tmp_path, "r" * 250, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["r" * 250]


def test_a_tree_is_copied_with_its_links_and_rwx_bits_a_fifo_left_out(tmp_path: Path) -> None:
    """A setuid, setgid or sticky bit is never copied (a root copy of another user's setuid program
    ran as root), nor group or other write; a FIFO is left out and named (it failed every copy),
    never opened."""
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "d" / "e").mkdir(parents=True)
    (source / "d" / "e" / "f").write_text("f")
    (source / "d" / "e" / "f").chmod(0o6770)
    (source / "link").symlink_to("/etc/passwd")  # copied as a link, never read through
    os.mkfifo(source / "d" / "pipe")
    (source / "d" / "e").chmod(0o3777)
    (source / "d").chmod(0o555)
    target.mkdir()
    src, dst = os.open(source, os.O_RDONLY), os.open(target, os.O_RDONLY)
    try:
        assert files.copy_tree(src, dst, 1 << 20) == ["'d/pipe' (a FIFO)"]  # returns: never opened
        assert os.readlink(target / "link") == "/etc/passwd"
        assert (target / "d" / "e" / "f").read_text() == "f"
        assert (target / "d" / "e" / "f").stat().st_mode & 0o7777 == 0o750
        assert (target / "d" / "e").stat().st_mode & 0o7777 == 0o755
        assert (target / "d").stat().st_mode & 0o7777 == 0o555
        (target / "d").chmod(0o755)
        files.remove_tree(dst, "d")
    finally:
        os.close(src)
        os.close(dst)
        (source / "d").chmod(0o755)


def test_a_users_path_follows_only_links_it_could_trust(tmp_path: Path) -> None:
    """As fs.protected_symlinks would in a sticky directory, whatever it is set to here: a link
    another user planted where a root run's path leads is not followed, and nothing is made."""
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    elsewhere.mkdir()
    (shared / "mine").symlink_to(elsewhere)
    fd, made = files.open_user_dir(shared / "mine" / "a" / "b", make=True)
    os.close(fd)
    assert made == [str(elsewhere / "a"), str(elsewhere / "a" / "b")], "named where they are"
    assert (elsewhere / "a" / "b").is_dir(), "a link of this user's is followed"
    if os.geteuid() == 0:
        (shared / "theirs").symlink_to(elsewhere)
        os.lchown(shared / "theirs", 65534, 65534)
        with pytest.raises(files.UntrustedLink, match="uid 65534"):
            files.open_user_dir(shared / "theirs" / "c", make=True)
        assert not (elsewhere / "c").exists(), "nothing made through another user's link"
    with pytest.raises(FileNotFoundError):
        files.open_user_dir(shared / "missing")


def test_a_link_is_followed_only_where_no_other_user_may_swap_it(tmp_path: Path) -> None:
    """This user's own link in a directory any user may write (no sticky bit), or below one: judged
    only by where it leads, it was followed, and a dir:// guard's CMD, handed the path, wrote
    wherever another user had swapped it to meanwhile. Refused, nothing made where it leads."""
    area, shared = tmp_path / "area", tmp_path / "shared"
    area.mkdir(mode=0o700)
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "l").symlink_to(area)
    (shared / "mine").mkdir(mode=0o755)  # this user's alone, but in the open directory
    (shared / "mine" / "l").symlink_to(area)
    for path in (shared / "l" / "guard", shared / "mine" / "l" / "guard"):
        with pytest.raises(files.UntrustedLink, match="others may write it") as refused:
            files.open_private_path(path)
        assert refused.value.filename == str(path.parent)
        with pytest.raises(files.UntrustedLink, match="another user may change"):
            files.open_user_dir(path, make=True)
    assert list(area.iterdir()) == [], "nothing made through the link"
    os.chmod(shared, 0o1777)  # sticky, as /tmp: only the link's owner may swap it
    os.close(files.open_private_path(shared / "l" / "guard"))
    assert (area / "guard").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's home")
def test_a_link_in_another_users_directory_is_not_followed_whoever_made_it(tmp_path: Path) -> None:
    """Root with another user's HOME: a link in their home — theirs, or root's own, which they may
    rename away and replace — led root's writes to root's directory or anywhere. Refused."""
    home, victim = tmp_path / "home", tmp_path / "victim"
    home.mkdir()
    victim.mkdir(mode=0o700)
    (home / "theirs").symlink_to(victim)
    os.lchown(home / "theirs", 65534, 65534)
    (home / "roots").symlink_to(victim)
    os.chown(home, 65534, 65534)
    with pytest.raises(files.UntrustedLink, match="uid 65534, neither yours nor root's"):
        files.open_user_dir(home / "theirs" / "a", make=True)
    with pytest.raises(files.UntrustedLink, match="uid 65534 owns it"):
        files.open_user_dir(home / "roots" / "a", make=True)
    with pytest.raises(files.UntrustedLink):
        files.open_private_path(home / "roots" / "a")
    assert list(victim.iterdir()) == []


def test_a_private_path_is_taken_as_the_kernel_takes_it_never_collapsed(tmp_path: Path) -> None:
    """`x/..` collapsed as text is the directory holding x; the kernel climbs from x's target when x
    is a link. Refused; `.` and `//`, which change nothing the kernel resolves, are not."""
    elsewhere = tmp_path / "elsewhere" / "sub"
    elsewhere.mkdir(parents=True)
    (tmp_path / "x").symlink_to(elsewhere)
    with pytest.raises(files.DotDot):
        files.open_private_path(f"{tmp_path}/x/../state")
    assert not (tmp_path / "state").exists() and not (tmp_path / "elsewhere" / "state").exists()
    os.close(files.open_private_path(f"{tmp_path}//./state/"))
    assert (tmp_path / "state").is_dir()


def test_a_run_removes_its_directory_however_deep_its_cmd_built_it() -> None:
    """shutil.rmtree raised RecursionError past ~1,000 levels, from a run's clean-up after CMD."""
    import tempfile

    top = tempfile.mkdtemp(prefix="holdfast-deep-")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1_500):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    parent = os.open(os.path.dirname(top), os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.remove_tree(parent, os.path.basename(top))
    finally:
        os.close(parent)
    assert not os.path.lexists(top)


def test_a_servers_ready_file_is_written_through_no_link(tmp_path: Path) -> None:
    """Agents and coordinators run as root: a link planted at the ready file, or at the name its
    temporary file once had (`<ready>.tmp`), overwrote the link's target."""
    from holdfast.common import serving

    victims = [tmp_path / "victim-1", tmp_path / "victim-2"]
    for victim in victims:
        victim.write_text("kept")
    ready = tmp_path / "agent.ready"
    ready.symlink_to(victims[0])
    Path(f"{ready}.tmp").symlink_to(victims[1])
    serving.announce(str(ready), serving.Serving(server=None, health=None, address="127.0.0.1:1"))  # type: ignore[arg-type]
    assert [victim.read_text() for victim in victims] == ["kept", "kept"]
    assert not ready.is_symlink() and ready.read_text() == '{"address": "127.0.0.1:1"}'
