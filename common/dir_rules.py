"""Who else may change a directory: the pure judgements behind `files.check_ancestors` (a
directory above a state directory) and `files.check_private_tree` (a directory in it).

Guarantee: `swappable_because` answers None only for a directory owned by this user or root that
nobody else may rename an entry of: sticky, or writable by no one but its owner — its group
bits without w, or with w for a group that is this user's alone (its effective gid, user-private)
and no POSIX ACL, whose group bits are only its mask over entries naming other users.
`acl_lets_others_write` answers whether an ACL's entries (a default ACL's, which what is made in
the directory inherits) let anyone but its owner write. No I/O here: files.py reads the modes,
groups and ACLs.
"""

from __future__ import annotations

import stat
import struct

ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"

# The kernel's xattr form of a POSIX ACL (linux/posix_acl_xattr.h): a version, then entries.
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")  # tag, permissions, id
_USER_OBJ, _MASK, _OTHER = 0x01, 0x10, 0x20
_WRITE = 0o2


def swappable_because(path: str, mode: int, uid: int, gid: int, *, euid: int, egid: int, acl: bool,
                      group_private: bool) -> str | None:
    """Why users other than `euid` (and root) could rename what is in the directory `path` (its
    `mode`, owner `uid`, group `gid`; `acl`: it has an access ACL; `group_private`: no user but
    `euid` is in group `gid`) and put a link at its name; None when none could."""
    if uid not in (0, euid):
        return f"uid {uid} owns it: it could swap what is in it for a link"
    if mode & stat.S_ISVTX:
        return None  # sticky, as /tmp: only an entry's owner (or the directory's) renames it
    bits = f"mode {stat.S_IMODE(mode):o}"
    swap = "and it is not sticky: they could swap what is in it for a link"
    if mode & 0o002:
        return f"others may write it ({bits}), {swap} (`chmod o-w {path}` closes that)"
    if not mode & 0o020:
        return None
    # With an ACL the group bits are its mask: they let users its entries name write, whatever
    # the group is.
    if acl:
        return (f"its POSIX ACL lets the users and groups it names write it ({bits}, the mask), {swap} "
                f"(`setfacl -b {path}` or `chmod g-w {path}` closes that)")
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
