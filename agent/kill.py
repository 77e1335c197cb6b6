"""Ending an owner tree, only after its identity is proven: SIGKILL through pidfds to the root and
to every process still carrying its token (each re-checked through its own pidfd), and
`cgroup.kill` where the identity names a cgroup whose inode still matches.
"""

from __future__ import annotations

import os
import signal

from holdfast.agent.environ import read_value
from holdfast.agent.scan import scan
from holdfast.v1 import agent_pb2


def _signal_carrier(pid: int, variable: bytes, token: bytes) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        # Re-read through the opened pidfd's pid: the process must still carry the token now.
        if read_value(pid, variable) != token:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def kill_tree(identity: agent_pb2.ProcessIdentity, variable: bytes, root_matched: bool) -> int:
    """Signals sent. The root is signalled only when just judged IDENTITY_MATCHED (its pid may
    belong to a stranger otherwise); carriers and the cgroup whenever the root is matched or
    proven dead, since descendants outlive their root."""
    sent = 0
    if root_matched:
        try:
            fd = os.pidfd_open(identity.pid)
            try:
                if not identity.pidfd_ino or os.fstat(fd).st_ino == identity.pidfd_ino:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    sent += 1
            finally:
                os.close(fd)
        except OSError:
            pass  # already gone: the probe after the kill reports it
    if identity.spawn_token:
        token = identity.spawn_token.encode()
        for carrier in scan(variable, token).carriers:
            if carrier.pid != identity.pid:
                sent += _signal_carrier(carrier.pid, variable, token)
    if identity.cgroup.path:
        try:
            if os.stat(identity.cgroup.path).st_ino == identity.cgroup.inode:
                with open(os.path.join(identity.cgroup.path, "cgroup.kill"), "w") as f:
                    f.write("1")
                sent += 1
        except OSError:
            pass  # the tree check after the kill says whether the cgroup emptied
    return sent
