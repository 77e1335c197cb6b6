"""Who else may change a directory: the pure judgements behind `files.check_ancestors` (a
directory above a state directory) and `files.check_private_tree` (a directory in it).

Guarantee: `swappable_because` answers None only for a directory owned by this user or root that
nobody else may rename an entry of: sticky, or writable by no one but its owner — its group
bits without w, or with w for a group that is this user's alone (its effective gid, a regular
user's gid, user-private) and no POSIX ACL, whose group bits are only its mask over entries
naming other users. `link_untrusted_because` answers None only for a link this user or root
made where it stands: theirs, and under one name. `owner_unknown_because` answers why owners
cannot be told apart from this process — it runs as the overflow id in a user namespace, which
every unmapped owner reads as. `made_mode` is what a directory holdfast makes may be: never
group- or other-writable, whatever the umask, so it never refuses what it made.
`acl_lets_others_write` answers whether an ACL's entries (a default ACL's, which what is made in
the directory inherits) let anyone but its owner write. `tls_file_refused_because` answers None only
for a regular file of this user's or root's under one name that no one else may write, and for a
private key no one outside its owner and group may read; `tls_file_unreadable_because` says what
mode and group one the reading user was denied needs. No I/O here: files.py reads the modes,
groups, ID maps and ACLs.
"""

from __future__ import annotations

import errno
import stat
import struct

ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"

# The kernel's xattr form of a POSIX ACL (linux/posix_acl_xattr.h): a version, then entries.
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")  # tag, permissions, id
_USER_OBJ, _MASK, _OTHER = 0x01, 0x10, 0x20
_WRITE = 0o2

# The first gid of a regular user (login.defs GID_MIN on Debian, Fedora, Arch): below it are gid 0
# and system groups, shared with services by design — OpenShift and `--user N:0` containers run any
# uid in gid 0 — and a process may hold any gid without /etc/group listing it, so those listings
# show no such group to be one user's alone.
USER_GID_MIN = 1000
# The kernel's map in the initial user namespace: every id is itself.
IDENTITY_MAP = ["0", "0", "4294967295"]


def made_mode(mode: int) -> int:
    """The permission bits a directory holdfast makes gets for `mode` asked: less group and other
    write. mkdir's mode bounds the umask's result and a default ACL's alike, so umask 000 (or 002
    with a shared group) never makes one that check_ancestors then refuses."""
    return mode & 0o755


def owner_unknown_because(kind: str, own: int, overflow: int, id_map: str | None) -> str | None:
    """Why this process, running as `own` (its effective `kind`, "uid" or "gid"; `overflow` is the
    kernel's overflow one, `id_map` /proc/self/<kind>_map or None unread), cannot tell its own files
    from others': in a user namespace every owner it does not map reads as the overflow id — root's
    and other users' alike — so running as that id, all of them read as its own. None when it can."""
    if own != overflow or (id_map is not None and id_map.split() == IDENTITY_MAP):
        return None
    flag = "--map-user" if kind == "uid" else "--map-group"
    return (f"whose files are this process's cannot be told: it runs as {kind} {own}, the kernel's overflow "
            f"{kind}, in a user namespace (/proc/self/{kind}_map is not the identity map), where every file "
            f"of a {kind} the namespace does not map — root's, other users' — reads as {kind} {own} too. "
            f"Next: run it as a {kind} the namespace maps other than {overflow} (`unshare {flag}=ID`, a "
            f"container's --user), or outside the namespace")


def link_untrusted_because(uid: int, nlink: int, *, euid: int) -> str | None:
    """Why a link (owner `uid`, `nlink` names) may lead where someone other than user `euid` or root
    chose: another user made it, or another user hard-linked it where it stands — a link of root's
    (`/var/run`) linked into a sticky directory where fs.protected_hardlinks is 0 is no choice of
    its owner's to stand there. None for this user's or root's link under one name."""
    if uid not in (0, euid):
        return f"is a link of uid {uid}, neither yours nor root's: not followed"
    if nlink > 1:
        return (f"is a link with {nlink} names (hard-linked): whoever linked it chose where it stands, not "
                "its owner; not followed")
    return None


def tls_file_refused_because(mode: int, uid: int, nlink: int, *, euid: int, secret: bool) -> str | None:
    """Why a key, certificate or CA bundle (its `mode`, owner `uid`, `nlink` names), opened without
    following a link, is not read by user `euid`: not a regular file (a FIFO would have blocked its
    read for ever), another user's (their ca.pem makes the client trust their coordinator), under
    another name too (where fs.protected_hardlinks is 0 any user may hard-link root's 0644 PEM —
    another CA — into a sticky TLS directory as agent-ca.pem: its owner never chose that name;
    `certs init`, a Secret's files and the systemd layout give each file one name), writable by
    others, or — `secret`, a private key — readable by others. A group may read a key: a pod's
    fsGroup is how a container of another uid than root reads a Secret's. None when it is read."""
    bits = f"mode {stat.S_IMODE(mode):o}"
    if not stat.S_ISREG(mode):
        return f"is not a regular file (type {stat.S_IFMT(mode):o}): never read as TLS material"
    if uid not in (0, euid):
        return f"is uid {uid}'s, neither yours nor root's: never trusted as TLS material"
    if nlink != 1:
        return (f"has {nlink} names (hard-linked: whoever may make a name here could have put it here), "
                "never trusted as TLS material: another name links to it: copy it to its own file")
    if mode & 0o022:
        return f"others may write it ({bits}): never trusted as TLS material"
    if secret and mode & 0o004:
        return (f"is a private key others may read ({bits}): `chmod 0640` it and `chgrp` it to the group of "
                "the service that reads it (or set the Secret's defaultMode 0440 and the pod's fsGroup)")
    return None


def tls_file_unreadable_because(err: int, strerror: str, *, euid: int, egid: int, secret: bool) -> str:
    """Why user `euid` (group `egid`) could not read a key, certificate or CA bundle (`err`, errno's
    `strerror`), and the next step: without it the service stops on a bare `PermissionError:
    'coordinator.key'`, naming neither the directory nor the mode it needs."""
    if err != errno.EACCES:
        return f"cannot be read ({strerror}): no TLS material read"
    who = f"uid {euid} (gid {egid}) may not read it"
    if secret:
        return (f"{who}: make the key root:<group> 0640 with uid {euid} in <group> (`chgrp <group>` and "
                f"`chmod 0640` it; the service's group, or the pod's fsGroup), or uid {euid}'s own 0600")
    return f"{who}: make it 0644 (root's or uid {euid}'s)"


def swappable_because(path: str, mode: int, uid: int, gid: int, *, euid: int, egid: int, acl: bool,
                      group_private: bool) -> str | None:
    """Why users other than `euid` (and root) could rename what is in the directory `path` (its
    `mode`, owner `uid`, group `gid`; `acl`: it has an access ACL; `group_private`: no user but
    `euid` is in group `gid`, by the user and group databases) and put a link at its name; None
    when none could. Group write is this user's only for its own gid and a regular user's, never
    a system group's, which the databases cannot show to be one user's alone."""
    if uid not in (0, euid):
        return f"uid {uid} owns it: it could swap what is in it for a link"
    if mode & stat.S_ISVTX:
        return None  # sticky, as /tmp: only an entry's owner (or the directory's) renames it
    bits = f"mode {stat.S_IMODE(mode):o}"
    swap = "and it is not sticky: they could swap what is in it for a link"
    if mode & 0o002:
        return f"others may write it ({bits}), {swap} (`chmod go-w {path}` closes that)"
    if not mode & 0o020:
        return None
    # With an ACL the group bits are its mask: they let users its entries name write, whatever
    # the group is.
    if acl:
        return (f"its POSIX ACL lets the users and groups it names write it ({bits}, the mask), {swap} "
                f"(`setfacl -b {path}` or `chmod g-w {path}` closes that)")
    if gid < USER_GID_MIN:
        return (f"group {gid}, a system group (below {USER_GID_MIN}: shared with services, and held by "
                f"processes /etc/group does not list), may write it ({bits}), {swap} "
                f"(`chmod g-w {path}` closes that)")
    if gid != egid or not group_private:
        return (f"group {gid}, not uid {euid}'s alone, may write it ({bits}), {swap} "
                f"(`chmod g-w {path}` closes that)")
    return None


def group_private(gid: int, members: list[str], name: str | None, users: list[tuple[int, int]],
                  euid: int) -> bool:
    """Whether group `gid` can hold nobody but user `euid` (called `name`): no member named but
    that user, and no other user — `users`, every (uid, primary gid) — has it as its primary group."""
    return (name is not None and set(members) <= {name}
            and all(uid == euid for uid, primary in users if primary == gid))


def acl_lets_others_write(blob: bytes) -> bool:
    """Whether the ACL `blob` (its xattr form) gives anyone but the owner write: an entry other
    than the owner's with w, where the mask (which limits every named entry and the group's)
    allows it too. A blob that does not parse is taken as letting them."""
    if len(blob) < _HEADER.size or (len(blob) - _HEADER.size) % _ENTRY.size:
        return True
    entries = [_ENTRY.unpack_from(blob, at) for at in range(_HEADER.size, len(blob), _ENTRY.size)]
    masks = [perm for tag, perm, _ in entries if tag == _MASK]
    if masks and not masks[0] & _WRITE:
        # Only the other entry, which no mask limits, can still write.
        return any(perm & _WRITE for tag, perm, _ in entries if tag == _OTHER)
    return any(perm & _WRITE for tag, perm, _ in entries if tag not in (_USER_OBJ, _MASK))
