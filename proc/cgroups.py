"""Session cgroups: made by the agent for every tree it attests, read for the tree proof, swept.

Guarantee: at AttestSpawn, while the gate is still blocked on its pipe and before anything of the
tree can fork, the agent makes `holdfast-<session>-<fence>-<random>` nested under the gate's
current cgroup (a pod's or a unit's limits still apply; no controller is enabled in it) and moves
the gate into it, so every descendant is born inside. Whatever the privileges of `holdfast run`
(an unprivileged run — the common case — could make none of its own). Where the agent cannot make
one it says why, per attestation, and the tree proof rests on the stable scan alone.

A recorded cgroup that no longer exists is empty: rmdir succeeds only on an empty cgroup, and a
parent goes only after its children (a deleted pod takes the nested cgroup with it). That holds
only where the agent sees the same hierarchy the cgroup was made in — the node's cgroup
namespace, the same namespace recorded — else nothing is known.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass

from holdfast.proc import cgroups_rules
from holdfast.proc.environ import read_proc_file
from holdfast.v1 import agent_pb2

CGROUP_MOUNTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
PREFIX = "holdfast-"
# Session ids are [A-Za-z0-9_-]{8,128}; the fence and the random part are parsed from the right.
_NAME = re.compile(r"^holdfast-[A-Za-z0-9_-]{8,128}-[0-9]{1,20}-[0-9a-f]{8}$")
_RANDOM = re.compile(r"[0-9a-f]{8}")  # the name's last part, os.urandom(4).hex()
# Records of earlier versions name cgroups that `run` (as root) made at <root>/holdfast/<name>.
LEGACY_PARENT = "holdfast"
SWEEP_GRACE_S = 60.0
YAMA_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_CLONE_NEWCGROUP = 0x02000000
P = agent_pb2.TreeProof

# mkdir + move must not interleave with a sweep, which would remove the cgroup before the gate is in.
_lock = threading.Lock()


def cgroup2_root() -> str:
    for mount in CGROUP_MOUNTS:
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            return mount
    return ""


def cgroup_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/cgroup").st_ino
    except OSError:
        return 0


def join_node_namespace() -> str:
    """Moves this process into PID 1's cgroup namespace (the node's, under hostPID); "" on success,
    else why not. Called before any thread starts. Python 3.11 has no os.setns."""
    import ctypes  # only an agent joins; `run` imports this module for paths and never pays for ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open("/proc/1/ns/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"/proc/1/ns/cgroup: {exc.strerror}"
    try:
        if libc.setns(fd, _CLONE_NEWCGROUP) != 0:
            return f"setns: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(fd)
    return ""


def _relative_cgroup(pid: int | str) -> str | None:
    """The v2 path /proc/<pid>/cgroup names, relative to the reader's cgroup namespace."""
    try:
        lines = read_proc_file(f"/proc/{pid}/cgroup").decode(errors="replace").splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


@dataclass(frozen=True)
class Capability:
    """Whether this agent can make session cgroups on this host, and why not."""

    root: str
    namespace: int
    able: bool
    reason: str


def capability() -> Capability:
    root = cgroup2_root()
    ns = cgroup_namespace()
    if not root:
        return Capability("", ns, False, "no cgroup v2 hierarchy is mounted")
    # A private cgroup namespace shows other processes' cgroups as /../.. paths, and the agent
    # could neither address nor move them: the node's namespace is needed (hostPID alone is not).
    for who in ("self", "1"):
        relative = _relative_cgroup(who)
        if relative is None or relative.startswith("/.."):
            return Capability(root, ns, False, f"/proc/{who}/cgroup reads {relative!r}: the agent is in a "
                              "private cgroup namespace; run it in the node's (cgroupns host)")
    # Session cgroups are nested under each gate's own cgroup, not at the root (which is often
    # mode 0555 even to root without CAP_DAC_OVERRIDE): what must hold here is a read-write mount.
    # A cgroup that still cannot be made is said per attestation.
    if os.statvfs(root).f_flag & os.ST_RDONLY:
        return Capability(root, ns, False, f"{root} is mounted read-only in the agent")
    return Capability(root, ns, True, "")


def is_session_cgroup(path: str, root: str) -> bool:
    """Whether path names a cgroup the agent makes for sessions (or an earlier version's)."""
    if not root or not path:
        return False
    path = os.path.normpath(path)
    if not path.startswith(root.rstrip("/") + "/"):
        return False
    parent, name = os.path.split(path)
    return bool(_NAME.fullmatch(name)) or (parent == os.path.join(root, LEGACY_PARENT) and
                                       name not in ("", ".", ".."))


def session_cgroup_of(pid: int, root: str, namespace: int) -> agent_pb2.CgroupRef | None:
    """The session cgroup pid runs in, read here from /proc/<pid>/cgroup; None outside one."""
    return _session_cgroup_at(_relative_cgroup(pid), root, namespace)


def _session_cgroup_at(relative: str | None, root: str, namespace: int) -> agent_pb2.CgroupRef | None:
    """The session cgroup at `relative` (a path /proc/<pid>/cgroup names); None when it is none."""
    if not root or relative is None or not relative.startswith("/"):
        return None
    path = os.path.normpath(root + relative)
    if not is_session_cgroup(path, root):
        return None
    try:
        return agent_pb2.CgroupRef(path=path, inode=os.stat(path).st_ino, cgroup_ns=namespace)
    except OSError:
        return None


def _move(pid: int, path: str) -> None:
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def undo(ref: agent_pb2.CgroupRef) -> None:
    """Moves whatever is in a session cgroup just made back to its parent, and removes it. For an
    attestation refused after its move: the gate may have exited and its pid been taken by another
    process before the move, which must not be left in a cgroup no record names."""
    parent = os.path.dirname(ref.path)
    with _lock, contextlib.suppress(OSError):
        with open(os.path.join(ref.path, "cgroup.procs")) as f:
            members = f.read().split()
        for pid in members:
            with contextlib.suppress(OSError):  # gone meanwhile
                _move(int(pid), parent)
        os.rmdir(ref.path)


def _made_for(path: str, session_id: str, fence: int) -> bool:
    """Whether `path` is a session cgroup made by this agent's user for exactly this session and
    fence. The whole name is compared: by its prefix alone, session `build-ci-1`'s cgroup
    `holdfast-build-ci-1-3-…` would pass for session `build-ci` at fence 1, so a `holdfast run` started
    inside the one tree would be attested in it, and a kill of the inner session would end the outer. The
    owner too: the owner of a delegated subtree (a systemd user manager's) can make a cgroup of
    any name, and one it made is not the agent's."""
    name, prefix = os.path.basename(path), f"{PREFIX}{session_id}-{fence}-"
    if not (name.startswith(prefix) and _RANDOM.fullmatch(name[len(prefix):])):
        return False
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


def make_session_cgroup(pid: int, session_id: str, fence: int,
                        cap: Capability) -> tuple[agent_pb2.CgroupRef | None, str]:
    """(the cgroup pid is now in, "") or (None, why not). Idempotent: a gate already in one of
    this session's and fence's cgroups keeps it."""
    if not cap.able:
        return None, cap.reason
    relative = _relative_cgroup(pid)  # read once: the cgroup a retry finds, or the parent of a new one
    current = _session_cgroup_at(relative, cap.root, cap.namespace)
    if current is not None and _made_for(current.path, session_id, fence):
        return current, ""
    if relative is None or not relative.startswith("/"):
        return None, f"/proc/{pid}/cgroup names no cgroup v2 path ({relative!r})"
    parent = os.path.normpath(cap.root + relative)
    with contextlib.suppress(OSError):
        kind = read_proc_file(os.path.join(parent, "cgroup.type")).decode(errors="replace").strip()
        if kind != "domain":
            return None, f"the gate's cgroup {parent} is {kind}: a session cgroup cannot be nested there"
    path = os.path.join(parent, f"{PREFIX}{session_id}-{fence}-{os.urandom(4).hex()}")
    with _lock:
        try:
            os.mkdir(path)
        except OSError as exc:
            return None, f"mkdir {path}: {exc.strerror} (cgroup.max.descendants or depth reached?)"
        try:
            _move(pid, path)
            ref = agent_pb2.CgroupRef(path=path, inode=os.stat(path).st_ino, cgroup_ns=cap.namespace)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return None, f"moving pid {pid} into {path}: {exc.strerror}"
    return ref, ""


def populated(ref: agent_pb2.CgroupRef, cap: Capability) -> bool | None:
    """From cgroup.events; None when nothing is known. A cgroup removed (absent, or its path now
    another inode) was empty when it went, and nothing enters a removed cgroup."""
    if not cap.root or (ref.cgroup_ns and ref.cgroup_ns != cap.namespace):
        return None
    try:
        if os.stat(ref.path).st_ino != ref.inode:
            return False
        for line in read_proc_file(os.path.join(ref.path, "cgroup.events")).splitlines():
            key, _, value = line.partition(b" ")
            if key == b"populated":
                return value.strip() != b"0"
    except FileNotFoundError:
        # Absent from a hierarchy the agent sees whole: removed, so empty. A legacy record made
        # under another mount point (root differs) is unknown.
        return False if ref.path.startswith(cap.root.rstrip("/") + "/") else None
    except OSError:
        return None
    return None


def kill(ref: agent_pb2.CgroupRef, cap: Capability) -> bool:
    """cgroup.kill on the recorded cgroup, only while its inode is the recorded one."""
    if not is_session_cgroup(ref.path, cap.root) or (ref.cgroup_ns and ref.cgroup_ns != cap.namespace):
        return False
    try:
        if os.stat(ref.path).st_ino != ref.inode:
            return False
        with open(os.path.join(ref.path, "cgroup.kill"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def sweep(cap: Capability, grace: float = SWEEP_GRACE_S) -> int:
    """Removes the empty session cgroups this host's agents made (also before a restart); rmdir
    refuses a populated one, so a live tree keeps its cgroup. One made in the last `grace` seconds
    is left alone: it may be another agent's attestation between its mkdir and its move (agents
    share one hierarchy under `holdfast up` and simulated hosts), which would otherwise find its
    cgroup gone and attest the tree with no cgroup at all. Returns how many went."""
    if not cap.able:
        return 0
    removed = 0
    young = time.time() - grace
    with _lock:
        for parent, dirs, _files in os.walk(cap.root, topdown=False):
            for name in dirs:
                if _NAME.match(name) or os.path.basename(parent) == LEGACY_PARENT:
                    path = os.path.join(parent, name)
                    with contextlib.suppress(OSError):
                        if os.stat(path).st_mtime > young:
                            continue
                        os.rmdir(path)
                        removed += 1
    return removed


def _status_fields(pid: int) -> dict[str, str]:
    text = read_proc_file(f"/proc/{pid}/status").decode(errors="replace")
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _descriptors(pid: int) -> list[cgroups_rules.Descriptor]:
    """The process's open descriptors, from their links and fdinfo alone: nothing is asked of the
    files themselves (a stat of one on a FUSE mount could wait forever). One closed meanwhile is
    skipped."""
    held = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            info = read_proc_file(f"/proc/{pid}/fdinfo/{name}").decode(errors="replace")
        except FileNotFoundError:
            continue
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        held.append(cgroups_rules.Descriptor(target, int(fields["flags"], 8), int(fields["mnt_id"])))
    return held


def _mounts(pid: int, descriptors: list[cgroups_rules.Descriptor]) -> dict[int, str]:
    """Mount id → type in the process's mount namespace; where a descriptor of it writes to a mount
    not there (its opener's: a service whose manager opened its log file before making it a mount
    namespace of its own), the agent's and PID 1's mounts too. One still unplaced counts as a cgroup
    file's."""
    mounts: dict[int, str] = {}
    for source in (f"/proc/{pid}/mountinfo", "/proc/self/mountinfo", "/proc/1/mountinfo"):
        mounts |= cgroups_rules.mount_types(read_proc_file(source).decode(errors="replace"))
        if not cgroups_rules.unplaced(descriptors, mounts):
            break
    return mounts


def ptrace_scope() -> int | None:
    """Yama's kernel.yama.ptrace_scope, read at each attestation (the host's root may change it);
    None where Yama is absent or the file unreadable. The sysctl is the kernel's, one for every
    namespace: an agent in a pod reads the node's."""
    try:
        return int(read_proc_file(YAMA_PTRACE_SCOPE))
    except (OSError, ValueError):
        return None


def tree_proof(pid: int, ref: agent_pb2.CgroupRef | None, cap: Capability) -> tuple[int, str]:
    """How this tree is proven gone (docs/design.md §2), by proc/cgroups_rules.py's rule over what is
    read here of the gate and of Yama: an empty cgroup alone only where nothing of the tree could
    leave it, since one that left and made its memory unreadable would be counted by neither.
    Anything unreadable needs the scan too."""
    if ref is None:
        return P.SCAN_ONLY, "no session cgroup"
    try:
        who = cgroups_rules.credentials(_status_fields(pid))
        if (decided := cgroups_rules.by_credentials(who)) is not None:
            return decided  # its descriptors and mounts, read for every attestation, would change nothing
        descriptors = _descriptors(pid)
        mounts = _mounts(pid, descriptors)
        inodes = []
        for ancestor in cgroups_rules.ancestors(ref.path, cap.root):
            st = os.stat(procs := os.path.join(ancestor, "cgroup.procs"))
            inodes.append((procs, cgroups_rules.Inode(st.st_uid, st.st_gid, st.st_mode)))
    except (OSError, ValueError, KeyError, IndexError) as exc:
        return P.CGROUP_AND_SCAN, f"its credentials could not be read ({exc}); the scan is needed too"
    return cgroups_rules.tree_proof(who, descriptors, mounts, inodes, ptrace_scope())
