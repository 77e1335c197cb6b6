"""POSIX ACLs written as the kernel stores them (system.posix_acl_*), so a test plants one with
os.setxattr where the `acl` package's setfacl is not installed."""

from __future__ import annotations

import os
import struct
from pathlib import Path

USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF


def acl(*entries: tuple[int, int, int]) -> bytes:
    """The xattr form of (tag, permissions, id) entries, in the order the kernel requires."""
    ordered = sorted(entries, key=lambda entry: (entry[0], entry[2]))
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in ordered)


def named_user(uid: int, perm: int = 0o7, mask: int = 0o7) -> bytes:
    """`setfacl -m u:UID:PERM` on a 0o755 directory: its owner rwx, group and others r-x."""
    return acl((USER_OBJ, 0o7, NO_ID), (USER, perm, uid), (GROUP_OBJ, 0o5, NO_ID), (MASK, mask, NO_ID),
               (OTHER, 0o5, NO_ID))


def grant(path: Path, uid: int, default: bool = False) -> None:
    """Lets user `uid` write the directory `path` by a named entry (the mask, shown as its group
    bits, rwx): its access ACL, or with `default` the ACL what is made in it inherits."""
    name = "system.posix_acl_default" if default else "system.posix_acl_access"
    os.setxattr(path, name, named_user(uid))
