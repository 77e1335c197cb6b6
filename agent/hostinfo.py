"""This host's identity as the agent sees it: machine, boot, PID namespace and its PID 1.

A host incarnation (DESIGN.md §2) is what "the same host, still up" means; every field comes from
the kernel, never from configuration, except the host id the operator names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from holdfast.agent.environ import read_proc_file
from holdfast.agent.procstat import parse_stat
from holdfast.v1 import agent_pb2

CGROUP_MOUNTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


@dataclass(frozen=True)
class HostFacts:
    incarnation: agent_pb2.HostIncarnation
    clock_ticks: int
    can_enumerate: bool
    pidfs: bool
    cgroup_root: str
    cgroup_writable: bool


def current_incarnation() -> agent_pb2.HostIncarnation:
    return agent_pb2.HostIncarnation(
        machine_id=Path("/etc/machine-id").read_text().strip(),
        boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        pid_ns=os.stat("/proc/self/ns/pid").st_ino,
        ns_init_start_ticks=parse_stat(read_proc_file("/proc/1/stat")).start_ticks,
    )


def has_pidfs() -> bool:
    """pidfs gives each process its own pidfd inode; older kernels share one anon inode."""
    try:
        a = os.pidfd_open(os.getpid())
        b = os.pidfd_open(os.getppid() or 1)
    except OSError:
        return False
    try:
        return os.fstat(a).st_ino != os.fstat(b).st_ino
    finally:
        os.close(a)
        os.close(b)


# Every session's gate gets its own cgroup directly under <cgroup2 root>/holdfast/. Only such a
# cgroup is ever recorded in an identity or killed: a shared cgroup (a system slice, the agent's
# own) in a record would make `cgroup.kill` end strangers and its emptiness prove nothing.
SESSION_CGROUP_PARENT = "holdfast"


def is_session_cgroup(path: str, root: str) -> bool:
    """Whether path names one session cgroup directly under root's holdfast/ subtree."""
    if not root or not path:
        return False
    parent, name = os.path.split(os.path.normpath(path))
    return parent == os.path.join(root, SESSION_CGROUP_PARENT) and name not in ("", ".", "..")


def cgroup2_root() -> str:
    for mount in CGROUP_MOUNTS:
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            return mount
    return ""


def gather() -> HostFacts:
    root = cgroup2_root()
    return HostFacts(
        incarnation=current_incarnation(),
        clock_ticks=os.sysconf("SC_CLK_TCK"),
        can_enumerate=os.path.isdir("/proc/self"),
        pidfs=has_pidfs(),
        cgroup_root=root,
        cgroup_writable=bool(root) and os.access(root, os.W_OK),
    )
