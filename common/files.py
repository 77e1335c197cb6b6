"""Writing a file whole into a directory that others may write too: a `--report` beside files of
other users, `up.json` in a state directory, a takeover's operation id in a private one.

Guarantee: `write_whole` opens the directory once, writes a new file under a random name created
exclusively without following a link (O_CREAT | O_EXCL | O_NOFOLLOW), and renames it over the name
within that same directory, so a link planted at the name or at any temporary name — by another
user, or by whoever owned the directory before — is replaced, never written through; a reader
sees the old file or the whole new one. `open_private_dir` refuses a directory that is a link, is
not this user's, or that others may write; `check_private_tree` refuses one with anything beneath
it so (or a link, or a default ACL letting others write what is made there), `check_ancestors`
one in a directory another user may change (who could swap it for a link) — by its mode, an ACL
naming them, or a group they are in (dir_rules) — and `open_private_file` a file so, before it
is written or truncated. `open_private_path` makes a directory so checked, making nothing in a
directory that fails `check_ancestors` or whose default ACL lets others write what is made there;
`open_existing_private_path` refuses what it would refuse and makes nothing at all.
`remove_tree` removes a tree from a directory it is given open, following no link and holding no
Python frame per level; `copy_tree` copies one directory's contents into another the same way,
so a directory swapped for a link on either side meanwhile is refused, never read or written
through, and carries no setuid, setgid, sticky, group or other write bit, no FIFO, socket or
device, no more data than its cap, and a hole or a second hard link as such, never as bytes;
of a tree another writer still changes, what is there as it goes (a name gone is left out);
`open_listed` opens a file a walk listed only while it is still that regular file, never
waiting on a FIFO renamed over it.
`open_user_dir` opens a directory a user named, following a link on the way only when no other
user could have made it or can swap it: the link is this user's own or root's under that one name
(not hard-linked there by another), and no directory holding it or above that one may another
user change (`check_ancestors`) — a link another user planted at `/tmp/x`, or made in their own
home, or root's own link in a directory any user may write, never takes a run's writes
elsewhere, now or when the path is followed again later. Every directory made here is 0o755 at
most whatever the umask, so none is refused next; and no owner is judged where it cannot be told
(`own_id`: the overflow uid in a user namespace, as which every unmapped owner reads).
`open_private_path` takes no `..`: after a link the kernel climbs from the link's target, not
back along the path as written.
`open_tls_dir` opens a TLS directory (keys, certificates, CA bundles) reached as `open_user_dir`
reaches one, no directory above it another user may change; one that others may write without
its sticky bit (a pod's 0777 emptyDir) stands for its subdirectory `holdfast-<uid>`, this user's
alone. `read_tls_file` reads one of its files through one descriptor: a link followed only as
`open_user_dir` follows one (a Kubernetes Secret's `..data` links are root's), the file opened
O_NOFOLLOW | O_NONBLOCK and read only if it is a regular file of this user's or root's under one
name that no one else may write, and, for a private key, read (dir_rules.tls_file_refused_because)
— another user's ca.pem, FIFO or link, a hard link to root's PEM, is refused (UntrustedFile), never
trusted or waited on; one this user cannot read is UntrustedFile too, naming its path and the mode
it needs.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from collections.abc import Callable, Sequence

from holdfast.common import dir_rules
from holdfast.common.link_rules import MAX_LINK_HOPS

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT  # a log's flags for open_private_file


class UntrustedLink(OSError):
    """A path a user named passes through a link another user made, or one in a directory another
    user may change (who could swap it for their own meanwhile)."""


class DotDot(UntrustedLink):
    """A path meant to be followed as the kernel follows it names `..`: read back along the path as
    written, it names another directory than the kernel's, which climbs from a link's target."""


class NotPrivate(OSError):
    """A directory meant to be this user's alone is a link, another user's, or writable by others."""


class UnknownOwner(NotPrivate):
    """Whose a file is cannot be told: this process runs as the overflow uid or gid in a user
    namespace, as which every file of an owner the namespace does not map reads."""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def own_id(kind: str, where: str | os.PathLike[str]) -> int:
    """This process's effective uid or gid (`kind`), the one a file's owner is compared with when
    judging `where`; UnknownOwner when that comparison tells nothing (dir_rules.owner_unknown_because):
    another user's or root's file would pass as this user's."""
    own = os.geteuid() if kind == "uid" else os.getegid()
    overflow = _read(f"/proc/sys/fs/overflow{kind}")
    why = dir_rules.owner_unknown_because(kind, own, int(overflow) if overflow else 65534,
                                          _read(f"/proc/self/{kind}_map"))
    if why is not None:
        raise UnknownOwner(errno.EPERM, why, os.fspath(where))
    return own


def _private(st: os.stat_result, me: int) -> bool:
    """Whether what `st` describes is user `me`'s (this process's own_id: whose files it makes) and
    no one else may write it: nobody else can have put or changed anything there."""
    return st.st_uid == me and not st.st_mode & 0o022


def open_private_dir(path: str | os.PathLike[str], make: bool = False, dir_fd: int | None = None) -> int:
    """A descriptor on `path` (in the directory open as `dir_fd`, if given), a directory of this
    user's that nobody else may write; with `make`, made 0o755 when missing."""
    me = own_id("uid", path)
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755, dir_fd=dir_fd)
    try:
        fd = os.open(path, OPEN_DIR | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode):
            raise NotPrivate(errno.EPERM, "is a link", os.fspath(path)) from None
        raise
    if not _private(os.fstat(fd), me):
        os.close(fd)
        raise NotPrivate(errno.EPERM, f"is not a directory of uid {me} that only it may write",
                         os.fspath(path))
    return fd


def _check_default_acl(fd: int, where: str) -> None:
    """Raises NotPrivate when the directory open as `fd` (called `where`) has a default ACL by which
    what is made in it later — whatever the umask, which such an ACL overrides — is writable by
    users other than its owner."""
    try:
        blob = os.getxattr(fd, dir_rules.ACL_DEFAULT)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise
    if dir_rules.acl_lets_others_write(blob):
        raise NotPrivate(errno.EPERM, "has a default ACL that lets other users write what is made in it "
                         f"(`setfacl -k {where}` removes it)", where)


def check_private_tree(top: int, where: str) -> None:
    """Raises NotPrivate naming the first entry beneath the directory open as `top` (called `where`)
    that is a link, neither a regular file nor a directory, not this user's, or that others may
    write, or the first directory there (`where` itself too) whose default ACL lets others write
    what is made in it: within a tree that passes, in a directory that passes `open_private_dir`,
    only this user (or root) can have put anything, so a path into it leads nowhere else. An
    access ACL naming others with write shows as the group's w (its mask), refused so. Each
    directory is opened from the one above without following a link; an entry removed while
    walked (another process of this user's at work there) is skipped."""
    me = own_id("uid", where)
    stack = [(os.dup(top), where)]
    try:
        while stack:
            fd, here = stack[-1]
            stack.pop()
            try:
                _check_default_acl(fd, here)
                for name in os.listdir(fd):
                    path = os.path.join(here, name)
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):  # a link too
                            raise NotPrivate(errno.EPERM, "is a link or special file (only regular files "
                                             "and directories are trusted there)", path)
                        if not _private(st, me):
                            raise NotPrivate(errno.EPERM, f"is not uid {me}'s alone (owner uid "
                                             f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})", path)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append((os.open(name, OPEN_DIR | os.O_NOFOLLOW, dir_fd=fd), path))
                    except FileNotFoundError:
                        continue
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


class Swappable(NotPrivate):
    """A directory another user may change holds the one meant to be this user's alone."""


def _has_acl(fd: int) -> bool:
    """Whether the directory open as `fd` has an access ACL (read from the descriptor, not a path
    another user could swap meanwhile)."""
    try:
        return dir_rules.ACL_ACCESS in os.listxattr(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False  # a file system without extended attributes has no ACL
        raise


def _group_private(gid: int) -> bool:
    """Whether group `gid` can hold nobody but this user, by the group and user databases."""
    try:
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False  # a group the database does not know: who else is in it is unknown
    try:
        name: str | None = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = None
    users = [(user.pw_uid, user.pw_gid) for user in pwd.getpwall()]
    return dir_rules.group_private(gid, members, name, users, os.geteuid())


def swappable_because(fd: int, where: str) -> str | None:
    """Why a user other than this one or root could rename what is in the directory open as `fd`
    (called `where`) — that directory alone, not those above it — by its owner, its mode, an ACL
    or a group with another member (dir_rules.swappable_because); None when none could."""
    me = own_id("uid", where)
    st = os.fstat(fd)
    # Group-writable for this user's own group is this user's only when the group holds nobody
    # else (a user-private group, umask 002's) and no ACL's mask stands for the bits. Judged only
    # without the sticky bit, and refused (own_id) when the group's owner cannot be told: the
    # overflow gid.
    judged = st.st_mode & 0o020 and not st.st_mode & stat.S_ISVTX
    ours = bool(judged) and st.st_gid == own_id("gid", where)
    return dir_rules.swappable_because(
        where, st.st_mode, st.st_uid, st.st_gid, euid=me, egid=os.getegid(),
        acl=bool(st.st_mode & 0o020) and _has_acl(fd), group_private=ours and _group_private(st.st_gid))


def check_ancestors(fd: int, where: str) -> None:
    """Raises Swappable naming the first of the directory open as `fd` (called `where`) and those
    above it that a user other than this one or root owns, or that others may write without its
    sticky bit (dir_rules.swappable_because): they could rename what is in it away and put a link
    at its name, so that a path through it — one handed to a child, which cannot be given a
    descriptor — leads where they choose. Each is judged by a descriptor opened from the one
    below, so the one judged is the one above."""
    here = os.dup(fd)
    path = os.path.abspath(where)
    try:
        while True:
            st = os.fstat(here)
            why = swappable_because(here, path)
            if why is not None:
                raise Swappable(errno.EPERM, why, path)
            above = os.open("..", OPEN_DIR, dir_fd=here)
            os.close(here)
            here, path = above, os.path.dirname(path)
            if (os.fstat(here).st_dev, os.fstat(here).st_ino) == (st.st_dev, st.st_ino):
                return  # "/": its own parent
    finally:
        os.close(here)


def exists_at(directory: int, name: str) -> bool:
    """Whether anything — a link too, dangling or not — is at `name` in the directory open as
    `directory`."""
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _may_make_in(fd: int, where: str) -> None:
    """Raises what a directory made in the one open as `fd` (called `where`) would be refused for,
    before it is made: that one may be swapped (check_ancestors), or its default ACL would let
    others write what is made there. Made first and removed on refusal, it is there meanwhile — a
    refusal that writes, seen by whoever watches, and told to remove an ACL from what is gone."""
    check_ancestors(fd, where)
    _check_default_acl(fd, where)


def open_private_path(path: str | os.PathLike[str], make: bool = True, mode: int = 0o755) -> int:
    """A descriptor on the directory `path`, made (`mode` less group and other write, whatever the
    umask; its missing parents 0o755 so) when missing:
    this user's, nobody else may write it, and no directory above it — nor any a link on the way
    is read from (open_user_dir) — may another user change (check_ancestors), nor write what is
    made in it by a default ACL. Nothing is made in a directory that fails that check, or whose
    default ACL would pass others' write on to what is made there (refused naming it, before
    anything is made) — not through another user's directory, such as a home that is not this
    user's (root's `su` without `-`) — and what was made is removed when the directory is
    refused all the same. Without `make`,
    nothing is made: FileNotFoundError when it is missing. DotDot for a path naming `..`: the
    path is followed as the kernel follows it, never collapsed as text."""
    path = _plain_path(path)
    made: list[str] = []
    try:
        parent, made = open_user_dir(os.path.dirname(path), make=make, before_make=_may_make_in)
        try:
            check_ancestors(parent, os.path.dirname(path))
            if make and not exists_at(parent, os.path.basename(path)):
                _check_default_acl(parent, os.path.dirname(path))
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.basename(path), dir_rules.made_mode(mode), dir_fd=parent)
                    made.append(path)
            try:
                fd = open_private_dir(os.path.basename(path), dir_fd=parent)
            except NotPrivate as exc:
                raise NotPrivate(exc.errno, exc.strerror, path) from None  # named whole
        finally:
            os.close(parent)
        try:
            _check_default_acl(fd, path)  # one inherited from the directory it was made in, too
        except OSError:
            os.close(fd)
            raise
        return fd
    except OSError:
        for directory in reversed(made):  # empty, just made on the way: a refusal changes nothing
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        raise


def open_existing_private_path(path: str | os.PathLike[str]) -> int | None:
    """open_private_path(`path`) without making anything: a descriptor on the directory when it is
    there, None when it is missing and open_private_path may make it — the deepest directory of
    its path that exists, reached as open_private_path reaches it (open_user_dir), lies in
    directories no other user may change (check_ancestors) and has no default ACL by which what is
    made in it is others' to write. What open_private_path would refuse is refused now: a caller
    that makes the directory only once it may (a run, once granted) is not refused then, after
    its grant ended the previous owner's run, nor leaves a directory behind when it is refused."""
    try:
        return open_private_path(path, make=False)
    except FileNotFoundError:
        pass
    where = os.path.dirname(_plain_path(path))
    while True:
        try:
            fd, _ = open_user_dir(where)
            break
        except FileNotFoundError:
            where = os.path.dirname(where)  # "/" is always there
    try:
        check_ancestors(fd, where)
        _check_default_acl(fd, where)
    finally:
        os.close(fd)
    return None


def _plain_path(path: str | os.PathLike[str]) -> str:
    """`path` made absolute (from the working directory) without `.` or empty components, which
    name nothing the kernel would not; DotDot for a `..`, which `os.path.abspath` would collapse as
    text — `x/..` is the directory above x's target when x is a link, not the one holding x."""
    name = os.fspath(path)
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise DotDot(errno.EINVAL, "names `..`, which is not followed: name the directory without it", name)
    return os.path.join(os.getcwd() if not name.startswith("/") else "/", *parts)


def open_private_file(directory: int | None, name: str, flags: int, mode: int = 0o600) -> int:
    """`name` in the directory open as `directory` (or a path, with None) opened with `flags`,
    never through a link (O_NOFOLLOW) nor waiting on a FIFO (O_NONBLOCK while opened); NotPrivate
    unless it is a regular file of this user's that nobody else may write, then closed unchanged —
    a log or lock file left by another user is refused, never appended to or truncated."""
    me = own_id("uid", name)
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=directory)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _private(st, me):
        os.close(fd)
        raise NotPrivate(errno.EPERM, f"is not a regular file of uid {me}'s alone (owner uid "
                         f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})", name)
    os.set_blocking(fd, True)
    return fd


class UntrustedFile(NotPrivate):
    """A TLS file not read: another user put it or may change it, another name links to it, it is no
    regular file, or this user cannot read it."""


def private_subdir_name() -> str:
    """The subdirectory of this user's alone in a directory others may write: `holdfast-<uid>`."""
    return f"holdfast-{os.geteuid()}"


def open_tls_dir(directory: str | os.PathLike[str], make: bool = False) -> tuple[int, str]:
    """A descriptor on the directory a TLS directory's files are read from and written to, and its
    path: `directory` itself when neither it nor any directory above it may another user change
    (check_ancestors); when only it may be — this user's or root's, but others may write it without
    the sticky bit, as a pod's emptyDir (0777, or 2777 with an fsGroup) — its subdirectory
    `holdfast-<uid>`, this user's alone (no link, no one else may write it), made 0700 with `make`:
    in the directory itself another user could rename a file of theirs over ca.pem. With `make`,
    missing directories are made (0700 the last; nothing made in a directory that fails
    check_ancestors); else FileNotFoundError when one is missing. Refused (Swappable, NotPrivate,
    UntrustedLink) otherwise."""
    where = os.fspath(directory)
    fd, made = open_user_dir(where, make=make, before_make=check_ancestors)
    try:
        if made:  # the directory itself, made now 0o755
            os.fchmod(fd, 0o700)
        st = os.fstat(fd)
        if swappable_because(fd, where) is None or st.st_uid not in (0, own_id("uid", where)):
            check_ancestors(fd, where)
            return fd, where
        above = os.open("..", OPEN_DIR, dir_fd=fd)
        try:
            check_ancestors(above, os.path.dirname(os.path.abspath(where)))
        finally:
            os.close(above)
        name = private_subdir_name()
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
        try:
            private = open_private_dir(name, dir_fd=fd)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "others may write this TLS directory, not sticky: "
                                    f"its files are read only from its subdirectory {name}, which is missing "
                                    "(a Kubernetes configMap volume is 0777: mount it as a projected volume)",
                                    where) from None
        except NotPrivate as exc:
            raise NotPrivate(exc.errno, exc.strerror, os.path.join(where, name)) from None
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return private, os.path.join(where, name)


def read_tls_file(directory: int, where: str, name: str, secret: bool = False) -> bytes:
    """The bytes of the TLS file `name` in the directory open as `directory` (called `where`, from
    open_tls_dir). A link there is followed only if this user or root made it where no other user
    may change (_check_link), its target reached as open_user_dir reaches a directory: a Kubernetes
    Secret's `ca.pem -> ..data/ca.pem`. The file is opened O_NOFOLLOW | O_NONBLOCK — a FIFO is
    refused, never waited on — and read only when dir_rules.tls_file_refused_because is None
    (`secret`: a private key); else UntrustedFile, as when it cannot be read (naming its path and the
    mode it needs). FileNotFoundError when it is missing."""
    parent = os.dup(directory)
    hops = 0
    try:
        while True:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
                break
            except FileNotFoundError:  # missing, not refused: its caller says how to make it
                raise
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise _unreadable(exc, os.path.join(where, name), secret) from None
            _check_link(parent, where, name, os.stat(name, dir_fd=parent, follow_symlinks=False))
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise OSError(errno.ELOOP, f"more than {MAX_LINK_HOPS} links", os.path.join(where, name))
            target = os.path.join(where, os.readlink(name, dir_fd=parent))
            os.close(parent)
            parent = -1
            where, name = os.path.dirname(target), os.path.basename(target)
            parent, _ = open_user_dir(where)
            check_ancestors(parent, where)
    finally:
        if parent >= 0:
            os.close(parent)
    try:
        st = os.fstat(fd)
        why = dir_rules.tls_file_refused_because(st.st_mode, st.st_uid, st.st_nlink,
                                                 euid=own_id("uid", where), secret=secret)
        if why is not None:
            raise UntrustedFile(errno.EPERM, why, os.path.join(where, name))
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except NotPrivate:  # refused above, or whose it is cannot be told (own_id)
        raise
    except OSError as exc:
        raise _unreadable(exc, os.path.join(where, name), secret) from None
    finally:
        os.close(fd)


def _unreadable(exc: OSError, path: str, secret: bool) -> UntrustedFile:
    """The TLS file at `path` this user could not read (`exc`), named with the mode and group it
    needs (dir_rules.tls_file_unreadable_because)."""
    return UntrustedFile(exc.errno, dir_rules.tls_file_unreadable_because(
        exc.errno, exc.strerror, euid=os.geteuid(), egid=os.getegid(), secret=secret), path)


def open_user_dir(path: str | os.PathLike[str], make: bool = False,
                  before_make: Callable[[int, str], None] | None = None) -> tuple[int, list[str]]:
    """A descriptor on the directory `path` names (relative to the working directory), each
    component opened from the one before; with `make`, the directories missing on the way are
    made 0o755 (never group- or other-writable, whatever the umask: what it makes, check_ancestors
    never refuses), after `before_make` (given the descriptor and path of the
    directory the first is made in) returns. Returns the descriptor and the directories made, in
    order. Raises UntrustedLink for a link on the way that another user made or could swap
    (_check_link)."""
    name = os.fspath(path)
    todo = list(reversed(name.split("/")))
    fd = os.open("/" if name.startswith("/") else ".", OPEN_DIR)
    where = "/" if name.startswith("/") else "."
    made: list[str] = []
    hops = 0
    try:
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not make:
                    raise
                if before_make is not None and not made:
                    before_make(fd, where)
                os.mkdir(part, dir_rules.made_mode(0o755), dir_fd=fd)
                made.append(os.path.join(where, part))
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                _check_link(fd, where, part, st)
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise OSError(errno.ELOOP, f"{name}: more than {MAX_LINK_HOPS} links")
                target = os.readlink(part, dir_fd=fd)
                todo.extend(reversed(target.split("/")))
                if target.startswith("/"):
                    os.close(fd)
                    fd, where = os.open("/", OPEN_DIR), "/"
                continue
            below = os.open(part, OPEN_DIR | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd, where = below, os.path.join(where, part)
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def _check_link(directory: int, where: str, name: str, st: os.stat_result) -> None:
    """Raises UntrustedLink unless the link `name` (its lstat `st`) in the directory open as
    `directory` (called `where`) is this user's or root's under that one name
    (dir_rules.link_untrusted_because) and neither that directory nor any above it may another
    user change (check_ancestors). A link another user owns, or hard-linked there, leads where they
    chose; one in a directory they may change — their own home, or one any user may write without
    the sticky bit — they could rename away and replace with theirs, between this walk and the next
    one by the same path (a CMD handed it), or during this one. UnknownOwner when whose it is
    cannot be told (own_id)."""
    path = os.path.join(where, name)
    why = dir_rules.link_untrusted_because(st.st_uid, st.st_nlink, euid=own_id("uid", path))
    if why is not None:
        raise UntrustedLink(errno.EPERM, why, path)
    try:
        check_ancestors(directory, where)
    except Swappable as exc:
        raise UntrustedLink(errno.EPERM, f"is a link in a directory another user may change, {exc.filename}: "
                            f"{exc.strerror}; not followed", path) from None


def open_beneath(top: int, parts: Sequence[str]) -> int:
    """A new descriptor on the directory `parts` below the one open as `top`, each component opened
    with O_NOFOLLOW: a link where a directory was — one another user swapped in meanwhile — is
    refused (OSError), never followed."""
    fd = os.dup(top)
    try:
        for part in parts:
            below = os.open(part, OPEN_DIR | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
    except OSError:
        os.close(fd)
        raise
    return fd


def _open_to_empty(parent: int, name: str) -> int:
    """A descriptor on the directory `name` in `parent`, opened without following a link and made
    0o700 when this user may: a carried 0o555 or 0o000 directory could not be emptied otherwise."""
    try:
        fd = os.open(name, OPEN_DIR | os.O_NOFOLLOW, dir_fd=parent)
    except PermissionError:
        # Not even readable (0o000): its mode is changed through an O_PATH descriptor, which
        # names that very directory, never a link put at its name meanwhile.
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
            fd = os.open(f"/proc/self/fd/{handle}", OPEN_DIR)
        finally:
            os.close(handle)
    with contextlib.suppress(OSError):  # another user's directory keeps its mode
        os.fchmod(fd, 0o700)
    return fd


def remove_tree(parent: int, name: str) -> None:
    """Removes `name` in the directory open as `parent`, and everything beneath it; raises OSError
    when something stays. No link is followed, and the walk down keeps a stack of descriptors
    rather than recursing: a tree thousands of levels deep (a carried copy may be 2,000) is
    removed, where shutil.rmtree raised RecursionError and left it behind."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except IsADirectoryError:
        pass
    except FileNotFoundError:
        return
    stack: list[tuple[int, str, int, list[str]]] = []
    try:
        fd = _open_to_empty(parent, name)
        stack.append((parent, name, fd, []))  # on the stack before listing: closed if that fails
        stack[-1][3].extend(os.listdir(fd))
        while stack:
            above, here, fd, names = stack[-1]
            if names:
                entry = names.pop()
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:
                    below = _open_to_empty(fd, entry)
                    stack.append((fd, entry, below, []))
                    stack[-1][3].extend(os.listdir(below))
                except FileNotFoundError:
                    pass
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(here, dir_fd=above)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


class Replaced(OSError):
    """A file found by its lstat was another by the time it was opened: something renamed over it."""


def open_listed(name: str, directory: int | None, listed: os.stat_result) -> int:
    """A descriptor for reading `name` (in the directory open as `directory`, if given), the
    regular file its lstat found as `listed`. Opened O_NONBLOCK: in a directory others may write,
    a FIFO renamed over the name after the lstat would otherwise block the open, waiting for a
    writer, for ever (a root `run` never releasing). Then required to be that very file — a
    regular file, same device and inode — else Replaced: never read from whatever took its place."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
        os.close(fd)
        raise Replaced(errno.ESTALE, "replaced by something else since it was listed: not read", name)
    os.set_blocking(fd, True)
    return fd


class OverCap(OSError):
    """A copy would hold more bytes of data than its cap: refused where it got to."""


def copied_mode(mode: int) -> int:
    """The permission bits a copy gets: read, write and execute, less group and other write. A
    setuid or setgid bit would turn a program another user wrote into one the copier made — root's,
    for a root copy — that runs with the copier's privileges for whoever executes it (sticky means
    nothing once carried); group or other write would let any local user edit the copier's files,
    or plant links in its directories where its CMD writes, as a carry restore refuses too."""
    return stat.S_IMODE(mode) & 0o755


def _kind(mode: int) -> str:
    """What a file of `mode` is, in words."""
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a link"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((said for test, said in kinds if test(mode)), f"of type {stat.S_IFMT(mode):o}")


class _NotCopied(Exception):
    """A name a copy listed that is gone since (no argument: left out, nothing to say), or was
    replaced by what is not copied in its place (the argument says what): a writer still at work
    in the tree copied, removing and renaming over its files."""


def _lstat(directory: int, name: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        raise _NotCopied() from None


def _link_text(directory: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=directory)
    except FileNotFoundError:
        raise _NotCopied() from None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # no longer a link
            raise _NotCopied(f"replaced by {_kind(_lstat(directory, name).st_mode)} while copied") from None
        raise


def _open_copied(name: str, directory: int, listed: os.stat_result) -> tuple[int, os.stat_result]:
    """A descriptor reading the regular file at `name` in `directory`, and its stat: the one its
    lstat found as `listed`, or a regular file renamed over it since (a save by rename: the new
    one is the file there now); never what else took its place (open_listed) — _NotCopied says
    what that is — and _NotCopied() when the name is gone."""
    for _ in range(2):
        try:
            return open_listed(name, directory, listed), listed
        except FileNotFoundError:
            raise _NotCopied() from None
        except OSError as exc:
            now = _lstat(directory, name)
            if not isinstance(exc, Replaced) and (now.st_dev, now.st_ino) == (listed.st_dev, listed.st_ino):
                raise  # that very file, unreadable: a failure, not a writer at work
            if not stat.S_ISREG(now.st_mode):
                raise _NotCopied(f"replaced by {_kind(now.st_mode)} while copied") from None
            listed = now
    raise _NotCopied("replaced again and again while copied")


def _copy_data(fin: int, fout: int, left: int, name: str) -> int:
    """Copies the data of `fin` into the empty file `fout`, its holes kept as holes (SEEK_DATA and
    SEEK_HOLE): a sparse file of 200 MB holding 4 KB copies as 4 KB, not 200 MB of zeros written.
    Returns the bytes written; OverCap once they would pass `left`."""
    size, at, written = os.fstat(fin).st_size, 0, 0
    while at < size:
        try:
            at = os.lseek(fin, at, os.SEEK_DATA)
            end = min(os.lseek(fin, at, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # a hole to the end, or the file cut short meanwhile
            raise
        while at < end:
            chunk = os.pread(fin, min(1 << 20, end - at), at)
            if not chunk:  # cut short meanwhile: what is left reads as a hole
                at = size
                break
            if written + len(chunk) > left:
                raise OverCap(errno.EFBIG, "more bytes of data than the copy's cap", name)
            os.pwrite(fout, chunk, at)
            written, at = written + len(chunk), at + len(chunk)
    os.ftruncate(fout, size)  # a hole at the end too
    return written


def _copy_file(source: int, target: int, name: str, st: os.stat_result,
               left: int) -> tuple[int, os.stat_result]:
    """Copies the regular file `name` (the one `st` describes, or one renamed over it since) into
    `target`; the bytes of data written (OverCap past `left`) and the stat of the file copied."""
    fin, st = _open_copied(name, source, st)
    try:
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=target)
        try:
            written = _copy_data(fin, fout, left, name)
            os.fchmod(fout, copied_mode(st.st_mode))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return written, st


def _link_again(target: int, first: tuple[list[str], str], into: int, name: str) -> None:
    """`name` in the directory open as `into`, a hard link to the copy already made at `first`
    (its directory's parts below `target`, and its name)."""
    where = open_beneath(target, first[0])
    try:
        os.link(first[1], name, src_dir_fd=where, dst_dir_fd=into, follow_symlinks=False)
    finally:
        os.close(where)


def copy_tree(source: int, target: int, cap_bytes: int) -> list[str]:
    """Copies everything beneath the directory open as `source` into the empty directory open as
    `target`: directories and files with their rwx bits less group and other write (copied_mode)
    and their times, links as links, holes as holes, and a file linked under several names once,
    linked again in the copy; OverCap once more than `cap_bytes` bytes of data would be written.
    Returns what was not copied — a FIFO, socket or device, none of which a copy can hold (opening
    a FIFO to copy it waits for a writer forever) — as the quoted path and what it is. Each
    directory is reached from `source` and `target` one O_NOFOLLOW component at a time
    (open_beneath), each name is opened or made relative to its directory's descriptor without
    following a link, files are created O_EXCL, and the walk keeps a stack rather than recursing:
    a directory another writer swaps for a link meanwhile, on either side, is refused (OSError),
    never read or written through. A tree another writer is still changing is copied as found: a
    name gone since it was listed is left out, a regular file renamed over a file after its lstat
    (a save by rename) is copied in its place, and anything else put there — a FIFO, never
    opened, a link, never followed (open_listed) — is left out and returned, saying so. What is
    left in `target` on a failure is the caller's to remove."""
    stack: list[list[str]] = [[]]
    made: list[tuple[list[str], os.stat_result]] = []
    linked: dict[tuple[int, int], tuple[list[str], str]] = {}
    skipped: list[str] = []
    left = cap_bytes
    while stack:
        parts = stack.pop()
        try:
            src = open_beneath(source, parts)
        except FileNotFoundError:
            continue  # removed since it was listed: copied as the empty directory it was made
        try:
            dst = open_beneath(target, parts)
            try:
                for name in sorted(os.listdir(src)):
                    try:
                        st = _lstat(src, name)
                        inode = (st.st_dev, st.st_ino)
                        if stat.S_ISLNK(st.st_mode):
                            os.symlink(_link_text(src, name), name, dir_fd=dst)
                        elif stat.S_ISREG(st.st_mode) and inode in linked:
                            _link_again(target, linked[inode], dst, name)
                        elif stat.S_ISREG(st.st_mode):
                            written, st = _copy_file(src, dst, name, st, left)
                            left -= written
                            if st.st_nlink > 1:
                                linked[(st.st_dev, st.st_ino)] = (parts, name)
                        elif stat.S_ISDIR(st.st_mode):
                            os.mkdir(name, 0o700, dir_fd=dst)
                            stack.append([*parts, name])
                            made.append((stack[-1], st))
                        else:
                            raise _NotCopied(_kind(st.st_mode))
                    except _NotCopied as exc:
                        skipped += [f"{'/'.join([*parts, name])!r} ({said})" for said in exc.args]
            finally:
                os.close(dst)
        finally:
            os.close(src)
    # Modes last, deepest first: a copied 0o555 or 0o000 directory is still written into until then.
    for parts, st in reversed(made):
        fd = open_beneath(target, parts)
        try:
            os.fchmod(fd, copied_mode(st.st_mode))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)
    return skipped


def make_dir(parent: int, prefix: str) -> str:
    """A new 0700 directory `prefix<random>` in the directory open as `parent`; its name."""
    while True:
        name = f"{prefix}{os.urandom(6).hex()}"
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            continue
        return name


def open_own_dir(parent: int, name: str) -> int:
    """A descriptor on the directory `name` in `parent`, never through a link; OSError (EPERM)
    unless it is this user's alone (its owner, no group or other bits): one another user swapped
    in for the one this user made."""
    me = own_id("uid", name)
    fd = os.open(name, OPEN_DIR | os.O_NOFOLLOW, dir_fd=parent)
    st = os.fstat(fd)
    if st.st_uid != me or st.st_mode & 0o077:
        os.close(fd)
        raise OSError(errno.EPERM, f"not this user's alone (owner uid {st.st_uid}, mode "
                      f"{stat.S_IMODE(st.st_mode):o})", name)
    return fd


def write_whole(directory: str | os.PathLike[str] | int, name: str, data: bytes, mode: int = 0o600,
                durable: bool = False) -> None:
    """`data` as `directory/name`, whole or not at all; `directory` a path or an open descriptor.
    Never through a link: the temporary file is created O_EXCL|O_NOFOLLOW beside the name and
    renamed over it, so a link planted at either name is replaced, never followed. `durable`: the
    data is on disk before the rename (what must survive a crash, a key)."""
    if os.sep in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is a name within one directory")
    fd = directory if isinstance(directory, int) else os.open(directory, OPEN_DIR)
    try:
        while True:
            # The name cut to 64 bytes: a name of up to NAME_MAX bytes must leave room for the rest.
            temp = f".{name.encode()[:64].decode(errors='ignore')}.{os.urandom(6).hex()}.tmp"
            try:
                out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              mode, dir_fd=fd)
            except FileExistsError:
                continue
            break
        try:
            with open(out, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)  # the mode asked for, whatever the umask
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=fd)
            raise
    finally:
        if not isinstance(directory, int):
            os.close(fd)
