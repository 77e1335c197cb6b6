"""Whose a file is, which links are followed, and what a directory holdfast makes may be: the pure
rules of common/dir_rules.py (the I/O around them: test_files.py, test_hostile_files.py)."""

from __future__ import annotations

from holdfast.common import dir_rules

IDENTITY = "         0          0 4294967295\n"


def test_the_overflow_id_in_a_user_namespace_tells_no_owner() -> None:
    """Unmapped owners — root's files, other users' — read as the overflow id: running as it, every
    one of them would pass as this process's own."""
    assert dir_rules.owner_unknown_because("uid", 65534, 65534, IDENTITY) is None  # nobody, on the host
    assert dir_rules.owner_unknown_because("uid", 1000, 65534, "0 1000 1\n") is None  # another uid
    why = dir_rules.owner_unknown_because("uid", 65534, 65534, "     65534      65534          1\n")
    assert why is not None and "overflow uid" in why and "--map-user" in why
    assert "--map-group" in str(dir_rules.owner_unknown_because("gid", 65534, 65534, "65534 0 1\n"))
    assert dir_rules.owner_unknown_because("uid", 4000, 4000, "0 100000 65536\n")  # overflowuid set to 4000
    assert dir_rules.owner_unknown_because("uid", 65534, 65534, None)  # the map unread: unknown


def test_a_link_is_trusted_only_as_this_users_or_roots_under_one_name() -> None:
    assert dir_rules.link_untrusted_because(1000, 1, euid=1000) is None
    assert dir_rules.link_untrusted_because(0, 1, euid=1000) is None  # root's, /var/run
    assert "uid 1001, neither yours nor root's" in str(dir_rules.link_untrusted_because(1001, 1, euid=1000))
    # Root's link hard-linked into a sticky directory by another user (fs.protected_hardlinks=0).
    assert "2 names" in str(dir_rules.link_untrusted_because(0, 2, euid=1000))
    assert "3 names" in str(dir_rules.link_untrusted_because(1000, 3, euid=1000))


def test_group_write_is_never_this_users_for_gid_0_or_a_system_group() -> None:
    """A process may hold gid 0 (OpenShift, `--user N:0`) or any system gid with no entry in
    /etc/passwd or /etc/group: the databases cannot show such a group is one user's alone."""
    def swappable(gid: int, euid: int) -> str | None:
        return dir_rules.swappable_because("/d", 0o040775, euid, gid, euid=euid, egid=gid, acl=False,
                                           group_private=True)
    assert "group 0, a system group" in str(swappable(0, 0))
    assert "group 999, a system group" in str(swappable(999, 999))
    assert swappable(dir_rules.USER_GID_MIN, 1000) is None  # a regular user's private group: umask 002's
    assert str(swappable(0, 0)).endswith("(`chmod g-w /d` closes that)")
    assert dir_rules.swappable_because("/d", 0o041775, 0, 0, euid=0, egid=0, acl=False,
                                       group_private=False) is None  # sticky: group write renames nothing


def test_a_directory_holdfast_makes_is_never_group_or_other_writable() -> None:
    assert dir_rules.made_mode(0o777) == 0o755
    assert dir_rules.made_mode(0o775) == 0o755
    assert dir_rules.made_mode(0o700) == 0o700
    assert dir_rules.made_mode(0o755) == 0o755


def test_tls_material_is_read_only_under_one_name_and_a_denied_read_says_what_it_needs() -> None:
    """A hard link (fs.protected_hardlinks=0) puts root's PEM — another CA's — at a name its owner
    never chose; a key others may read is closed by 0640 to the service's group, not `o-r` alone
    (root's group would then shut the service out); a denied read names the mode it needs."""
    def refused(mode: int, nlink: int = 1, secret: bool = False) -> str | None:
        return dir_rules.tls_file_refused_because(mode, 0, nlink, euid=1000, secret=secret)
    assert refused(0o100644) is None
    assert refused(0o100640, secret=True) is None
    assert "another name links to it: copy it to its own file" in str(refused(0o100644, nlink=2))
    assert "2 names" in str(refused(0o100600, nlink=2, secret=True))
    why = str(refused(0o100644, secret=True))
    assert "`chmod 0640`" in why and "`chgrp`" in why
    key = dir_rules.tls_file_unreadable_because(13, "Permission denied", euid=999, egid=999, secret=True)
    assert "uid 999 (gid 999) may not read it" in key and "root:<group> 0640 with uid 999 in <group>" in key
    assert "0644" in dir_rules.tls_file_unreadable_because(13, "Permission denied", euid=999, egid=999,
                                                           secret=False)
    assert "Input/output error" in dir_rules.tls_file_unreadable_because(5, "Input/output error", euid=999,
                                                                         egid=999, secret=True)
