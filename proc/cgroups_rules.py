"""Whether a tree can leave its session cgroup, as a pure rule over what the agent read of its gate.

Guarantee: CGROUP_ONLY — an empty session cgroup alone proves the tree gone, whatever a scan could
or could not read — is chosen only when no credential the gate has or can regain can move a process
out of that cgroup, and the kernel lets the tree take no other process's. Otherwise a process of the
tree could leave it, make its own memory unreadable (so no scan counts it as a carrier of the
token), outlive the rest, and the empty cgroup would have a second owner granted while it writes.
Where this cannot be shown the proof is CGROUP_AND_SCAN.

The kernel's rule (cgroup v2): moving a process from cgroup S to cgroup D needs write access to the
`cgroup.procs` of their nearest common ancestor, checked with the credentials of whoever opened the
file written to. Every D outside S has that ancestor at or above S's parent. So the tree is held
when all of these hold of the gate and its kernel, read while it is blocked and before anything of
the tree runs:

- no-new-privileges (NoNewPrivs 1): an exec ignores setuid and setgid bits and file capabilities;
- no permitted and no ambient capability (CapPrm, CapAmb; CapEff is a subset of CapPrm): any of
  CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SYS_ADMIN, … writes every `cgroup.procs`, and with none
  permitted none comes back: a setresuid to uid 0 raises the effective set from the permitted one
  only, and an exec as uid 0 under no-new-privileges keeps no more than it had;
- for every uid it has or may switch to without privilege (Uid: real, effective, saved, fs) and
  every gid (Gid's four and Groups), no `cgroup.procs` from S's parent up to the hierarchy's root is
  writable: a uid 0 counts as writing any (root owns them), a file owned by one of its uids counts as
  writable whatever its mode (its owner may chmod it), a group's or other's write bit as the mode says;
- it holds no descriptor opened for writing on a cgroup2 mount, nor one on a mount the agent cannot
  place (opened in another mount namespace): a descriptor opened by root (a redirection of stdout by
  a root shell before it dropped privileges) writes with root's credentials;
- Yama's kernel.yama.ptrace_scope is 1 or more, read at the attestation: with it absent or 0 a
  process of the tree may attach to any dumpable process of its uid, outside the tree too, and take
  what that one holds open (pidfd_getfd(2)) or make it write (ptrace, /proc/<pid>/mem,
  process_vm_writev) — a `cgroup.procs` its root starter opened for writing before dropping to the
  same uid moves the tree's process out with root's credentials. Scope 1 lets PTRACE_MODE_ATTACH
  (all four of those) reach only descendants, which are in the cgroup, and processes that named the
  tree their tracer (PR_SET_PTRACER): such a process cooperates, as a privileged daemon that moves
  processes on request does, and no proof can exclude either. Reopening /proc/<pid>/fd/N is
  PTRACE_MODE_READ, which Yama leaves alone, but a reopen is a new open, checked and written with
  the opener's own credentials. The host's root lowering the scope later is the host's root acting,
  as moving processes is.

Mounts do not decide anything else: a read-only cgroup2 mount in the gate's own mount namespace
does not stop a root process writing through `/proc/<pid>/root/…` of a process in another one, so
a uid 0 is never held. User namespaces: an unprivileged process may make one and hold every
capability in it, but such a capability reaches only inodes whose owner and group are mapped in it,
and without privilege it maps only its own uid and gid — inodes of its own uid, counted writable
above. (A range of subordinate ids needs newuidmap, a setuid program that no-new-privileges runs
without its privilege.) Nor do they open Yama: its exception for CAP_SYS_PTRACE is judged in the
user namespace of the process attached to, which for one outside the tree is not one the tree made.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from holdfast.v1 import agent_pb2

P = agent_pb2.TreeProof
_ACCESS_MODE = 0o3  # O_ACCMODE; O_WRONLY 1, O_RDWR 2
_O_PATH = 0o10000000


@dataclass(frozen=True)
class Credentials:
    """What /proc/<pid>/status says of a process's privileges."""

    no_new_privs: bool
    capabilities: int  # CapPrm | CapAmb
    uids: frozenset[int]  # real, effective, saved, fs
    gids: frozenset[int]  # real, effective, saved, fs, and the supplementary groups


class Inode(NamedTuple):
    """A file's owner, group and mode bits, as stat gives them."""

    uid: int
    gid: int
    mode: int


@dataclass(frozen=True)
class Descriptor:
    """One open descriptor: where /proc/<pid>/fd/N points, and its fdinfo flags and mount."""

    target: str
    flags: int
    mount_id: int


def credentials(status: Mapping[str, str]) -> Credentials:
    """From /proc/<pid>/status fields (name → value); KeyError or ValueError when one is missing or
    malformed."""
    uids, gids = status["Uid"].split(), status["Gid"].split()
    if len(uids) != 4 or len(gids) != 4:
        raise ValueError(f"Uid {status['Uid']!r} / Gid {status['Gid']!r}: four ids each expected")
    return Credentials(
        no_new_privs=status["NoNewPrivs"].strip() == "1",
        capabilities=int(status["CapPrm"], 16) | int(status["CapAmb"], 16),
        uids=frozenset(int(u) for u in uids),
        gids=frozenset(int(g) for g in [*gids, *status["Groups"].split()]),
    )


def may_write(inode: Inode, who: Credentials) -> bool:
    """Whether some uid or gid `who` has or may switch to could write to the file (capabilities
    aside): as its owner (who may chmod it), as root, or by a group's or other's write bit."""
    if 0 in who.uids or inode.uid in who.uids:
        return True
    return bool((inode.gid in who.gids and inode.mode & stat.S_IWGRP) or inode.mode & stat.S_IWOTH)


def mount_types(mountinfo: str) -> dict[int, str]:
    """Mount id → filesystem type, from a /proc/<pid>/mountinfo."""
    types = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right:
            types[int(left.split(" ", 1)[0])] = right.split(" ", 1)[0]
    return types


def _writes_a_file(held: Descriptor) -> bool:
    """Opened for writing, on a file (not a pipe, socket or anonymous inode)."""
    return bool(held.flags & _ACCESS_MODE and not held.flags & _O_PATH and held.target.startswith("/"))


def unplaced(descriptors: Sequence[Descriptor], mounts: Mapping[int, str]) -> bool:
    """Whether a descriptor writes a file on a mount not in `mounts` (opened in another mount
    namespace: mount ids are unique across namespaces, so another one's mountinfo may place it)."""
    return any(_writes_a_file(held) and held.mount_id not in mounts for held in descriptors)


def writes_cgroups(held: Descriptor, mounts: Mapping[int, str]) -> bool:
    """Whether a descriptor may write a cgroup file with its opener's credentials: it writes a file
    of a cgroup2 mount, or of a mount not in `mounts` (what that is cannot be told)."""
    return _writes_a_file(held) and mounts.get(held.mount_id, "cgroup2") == "cgroup2"


def ancestors(cgroup: str, root: str) -> list[str]:
    """The cgroup directories from `cgroup`'s parent up to the hierarchy's root `root`, inclusive;
    none when `cgroup` is not below `root`."""
    root, path = posixpath.normpath(root), posixpath.normpath(cgroup)
    found = []
    while path != root and path.startswith(root.rstrip("/") + "/"):
        path = posixpath.dirname(path)
        found.append(path)
    return found


def by_credentials(who: Credentials) -> tuple[int, str] | None:
    """CGROUP_AND_SCAN when the gate's credentials alone let it leave its cgroup (a root gate's, as
    most are: nothing else of it need be read); None when what it holds open, the cgroup files above
    it and Yama decide."""
    if not who.no_new_privs:
        return P.CGROUP_AND_SCAN, "it could leave its cgroup (it may gain privileges: no no-new-privileges)"
    if who.capabilities:
        return P.CGROUP_AND_SCAN, (f"it holds capabilities ({who.capabilities:#x} permitted or ambient) "
                                   "with which it could leave its cgroup")
    if 0 in who.uids:
        return P.CGROUP_AND_SCAN, "it has or may regain uid 0, which owns the cgroups it could leave through"
    return None


def tree_proof(who: Credentials, descriptors: Sequence[Descriptor], mounts: Mapping[int, str],
               procs: Sequence[tuple[str, Inode]], ptrace_scope: int | None) -> tuple[int, str]:
    """The proof for a tree in a session cgroup, its gate being `who` holding `descriptors`
    (`mounts` its mount namespace's), `procs` the `cgroup.procs` files of the cgroup's ancestors, on
    a kernel whose kernel.yama.ptrace_scope is `ptrace_scope` (None: Yama absent, or it unreadable).
    The gate's own ways out are named before Yama's: they stay open whatever the scope."""
    if (decided := by_credentials(who)) is not None:
        return decided
    for held in descriptors:
        if writes_cgroups(held, mounts):
            return P.CGROUP_AND_SCAN, (f"it holds {held.target} open for writing, which writes a cgroup's "
                                       "processes with its opener's credentials")
    if not procs:
        return P.CGROUP_AND_SCAN, "no cgroup.procs above its cgroup was read"
    for path, inode in procs:
        if may_write(inode, who):
            return P.CGROUP_AND_SCAN, f"it may write {path} and leave its cgroup"
    if ptrace_scope is None or ptrace_scope < 1:
        scope = "absent or unreadable" if ptrace_scope is None else ptrace_scope
        return P.CGROUP_AND_SCAN, (f"any process of its uid outside the tree may be ptraced (kernel.yama."
                                   f"ptrace_scope is {scope}), and what it holds open taken")
    return P.CGROUP_ONLY, ("no new privileges, no capabilities, no uid 0, no cgroup.procs above its cgroup "
                           "that a uid or gid of it may write, and Yama keeps its ptrace to its descendants")
