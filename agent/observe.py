"""The I/O behind a probe: look at one pid through a fresh pidfd and /proc, and at one token's tree.

The pidfd is opened before /proc is read, and polled after, so a pid reused in between is caught:
a readable pidfd means the process it names has exited, whatever /proc now shows.
"""

from __future__ import annotations

import errno
import os
import select

from holdfast.agent.environ import read_environ, read_proc_file, value_in_block
from holdfast.agent.hostinfo import is_session_cgroup
from holdfast.agent.probe_rules import Observation, TreeObservation
from holdfast.agent.procstat import StatParseError, parse_stat
from holdfast.agent.scan import Scan
from holdfast.v1 import agent_pb2

_GONE = (errno.ENOENT, errno.ESRCH)


def pidfd_exited(fd: int) -> bool:
    """A pidfd polls readable once the whole thread group it names has exited."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def observe(identity: agent_pb2.ProcessIdentity, variable: bytes, exit_watched: bool) -> Observation:
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
                return Observation(exit_watched=exit_watched, absent=True)
            return Observation(exit_watched=exit_watched, error=f"/proc/{pid}/stat: {exc.strerror}")
        except StatParseError as exc:
            return Observation(exit_watched=exit_watched, error=f"/proc/{pid}/stat unparsable: {exc}")
        token: bool | None = None
        if identity.spawn_token:
            try:
                block = read_environ(pid)
                # No environ at all (a zombie's memory is gone) and an unreadable one are no evidence.
                if block is not None:
                    token = value_in_block(block, variable) == identity.spawn_token.encode()
            except OSError:
                token = None
        return Observation(exit_watched=exit_watched, state=stat.state, start_ticks=stat.start_ticks,
                           pidfd_ino=ino, pidfd_exited=pidfd_exited(fd), token_matched=token)
    finally:
        os.close(fd)


def session_cgroup_of(pid: int, root: str) -> agent_pb2.CgroupRef | None:
    """The session cgroup pid runs in, read from /proc/<pid>/cgroup on this host; None outside one.

    This is how a cgroup enters an identity: attested here, never named by a client.
    """
    try:
        lines = read_proc_file(f"/proc/{pid}/cgroup").decode(errors="replace").splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in lines if line.startswith("0::")), "")
    path = os.path.normpath(root + relative) if root and relative.startswith("/") else ""
    if not is_session_cgroup(path, root):
        return None
    try:
        return agent_pb2.CgroupRef(path=path, inode=os.stat(path).st_ino)
    except OSError:
        return None


def cgroup_populated(ref: agent_pb2.CgroupRef) -> bool | None:
    """From cgroup.events; None when it cannot be read or the inode names another cgroup.

    A session cgroup gone from a visible holdfast/ hierarchy is empty: rmdir of a cgroup succeeds
    only when it has no processes and no children (a later fence's `run` sweeps empty ones, maybe
    before this owner's Release). With the hierarchy itself missing here, nothing is known.
    """
    try:
        if os.stat(ref.path).st_ino != ref.inode:
            return None
        for line in read_proc_file(os.path.join(ref.path, "cgroup.events")).splitlines():
            key, _, value = line.partition(b" ")
            if key == b"populated":
                return value.strip() != b"0"
    except FileNotFoundError:
        return False if os.path.isdir(os.path.dirname(ref.path)) else None
    except OSError:
        return None
    return None


def observe_tree(identity: agent_pb2.ProcessIdentity, scan: Scan) -> TreeObservation:
    # Only unreadable processes that could be members of this tree leave its absence unproven.
    unreadable = scan.unreadable_since(identity.start_ticks)
    return TreeObservation(
        enumerable=scan.enumerable,
        complete=scan.enumerable and unreadable == 0,
        unreadable=unreadable,
        carriers=len(scan.of_token(identity.spawn_token.encode())),
        cgroup_populated=cgroup_populated(identity.cgroup) if identity.cgroup.path else None,
    )
