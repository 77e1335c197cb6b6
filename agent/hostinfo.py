"""This host's identity as the agent sees it: machine, boot, PID namespace and its PID 1.

A host incarnation (docs/design.md §2) is what "the same host, still up" means; every field comes from
the kernel, never from configuration, except the host id the operator names. `refusal` says when
these facts prove nothing (agent/hostinfo_rules.py): the agent then does not start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from holdfast.agent import hostinfo_rules
from holdfast.common import timens
from holdfast.proc import cgroups
from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import parse_stat
from holdfast.v1 import agent_pb2


@dataclass(frozen=True)
class HostFacts:
    incarnation: agent_pb2.HostIncarnation
    clock_ticks: int
    can_enumerate: bool
    pidfs: bool
    cgroups: cgroups.Capability

    @property
    def cgroup_root(self) -> str:
        return self.cgroups.root


def current_incarnation() -> agent_pb2.HostIncarnation:
    return agent_pb2.HostIncarnation(
        machine_id=machine_id(),
        boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        pid_ns=os.stat("/proc/self/ns/pid").st_ino,
        ns_init_start_ticks=parse_stat(read_proc_file("/proc/1/stat")).start_ticks,
    )


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def machine_id() -> str:
    """/etc/machine-id, "" when unreadable."""
    return (_read("/etc/machine-id") or "").strip()


def refusal() -> str:
    """'' when this agent may serve here, else why not and the fix."""
    return hostinfo_rules.refusal(machine_id(), *timens.time_namespace())


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


def gather() -> HostFacts:
    return HostFacts(
        incarnation=current_incarnation(),
        clock_ticks=os.sysconf("SC_CLK_TCK"),
        can_enumerate=os.path.isdir("/proc/self"),
        pidfs=has_pidfs(),
        cgroups=cgroups.capability(),
    )
