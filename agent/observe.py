"""The I/O behind a probe: look at one pid through a fresh pidfd and /proc, and at one token's tree.

The pidfd is opened before /proc is read, and polled after, so a pid reused in between is caught:
a readable pidfd means the process it names has exited, whatever /proc now shows. A /proc/<pid>
missing after the open is the process's end only when the pidfd says so: a /proc mounted with
hidepid hides a live process the same way (`probe_rules.missing_from_proc`).
"""

from __future__ import annotations

import errno
import os
import select

from holdfast.agent.probe_rules import Observation, TreeObservation, missing_from_proc, token_decides
from holdfast.proc import cgroups
from holdfast.proc.environ import EnvironReader, read_proc_file, value_in_block
from holdfast.proc.procstat import StatParseError, parse_stat
from holdfast.proc.scan import Scan
from holdfast.v1 import agent_pb2

_GONE = (errno.ENOENT, errno.ESRCH)


def pidfd_exited(fd: int) -> bool:
    """A pidfd polls readable once the whole thread group it names has exited."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def observe(identity: agent_pb2.ProcessIdentity, variable: bytes, exit_watched: bool,
            environ: EnvironReader) -> Observation:
    """What /proc shows of the identity's pid; its environ read through `environ`, and only when the
    token can change the verdict (`token_decides`)."""
    pid = identity.pid
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno in _GONE:
            return Observation(exit_watched=exit_watched, absent=True)
        return Observation(exit_watched=exit_watched, error=f"pidfd_open({pid}): {exc.strerror}")
    try:
        ino = os.fstat(fd).st_ino
        try:
            stat = parse_stat(read_proc_file(f"/proc/{pid}/stat"))
        except OSError as exc:
            if exc.errno in _GONE:
                return missing_from_proc(pid, exit_watched, pidfd_exited(fd))
            return Observation(exit_watched=exit_watched, error=f"/proc/{pid}/stat: {exc.strerror}")
        except StatParseError as exc:
            return Observation(exit_watched=exit_watched, error=f"/proc/{pid}/stat unparsable: {exc}")
        token: bool | None = None
        if token_decides(identity, ino):
            try:
                block = environ(pid, stat.start_ticks, "/proc")
                # No environ at all (a zombie's memory is gone) and an unreadable (or stuck) one are
                # no evidence.
                if block is not None:
                    token = value_in_block(block, variable) == identity.spawn_token.encode()
            except OSError:
                token = None
        return Observation(exit_watched=exit_watched, state=stat.state, start_ticks=stat.start_ticks,
                           pidfd_ino=ino, pidfd_exited=pidfd_exited(fd), token_matched=token)
    finally:
        os.close(fd)


def observe_tree(identity: agent_pb2.ProcessIdentity, scan: Scan, cap: cgroups.Capability) -> TreeObservation:
    # Only unreadable processes that could be members of this tree leave its absence unproven.
    unreadable = scan.unreadable_since(identity.start_ticks)
    return TreeObservation(
        enumerable=scan.enumerable,
        complete=scan.enumerable and scan.stable and unreadable == 0,
        unreadable=unreadable,
        carriers=len(scan.of_token(identity.spawn_token.encode())),
        cgroup_populated=cgroups.populated(identity.cgroup, cap) if identity.cgroup.path else None,
        stable=scan.stable,
        passes=scan.passes,
        hidden=scan.hidden,
    )
