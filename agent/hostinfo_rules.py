"""Whether this host's facts, as the agent read them, let it prove anything: pure rules over what
hostinfo gathered, applied by `agent serve` (which refuses to start) and by `agent doctor`.

Every start time the agent reads — a process's, its PID namespace init's (the host incarnation) —
comes from /proc/<pid>/stat, which the kernel (Linux >= 5.6) shifts by the *reader's* time
namespace's boottime offset. An agent restarted under another offset (`unshare --time`, an OCI
`linux.timeOffsets`, a checkpoint restored by CRIU) would read a live owner's start, and its own
namespace init's, as different from what the agent before it recorded: a live owner "another
process", its host incarnation "ended", every tree member "older than the root" and never read.

Guarantee: an agent serves only in the initial time namespace (whose offsets are zero and cannot
be changed, and which a running process cannot be moved out of by anyone but itself), or on a
kernel without time namespaces (common/timens_rules.py), so every start time it reads or records is
in that one clock; and only with a machine id that names one machine (common/incarnation_rules.py).
"""

from __future__ import annotations

from holdfast.common.incarnation_rules import machine_id_problem
from holdfast.common.timens_rules import time_namespace_problem

TIME_NS_FIX = ("run the agent in the host's initial time namespace: no `unshare --time`, no time "
               "namespace or linux.timeOffsets in its container's OCI spec; restart it rather than "
               "restore a checkpoint of it (CRIU)")
MACHINE_ID_FIX = ("give the machine a unique /etc/machine-id (`systemd-machine-id-setup`, or "
                  "`dbus-uuidgen > /etc/machine-id`) and mount the node's own into the agent's container")


def refusal(machine_id: str, time_ns: int | None, offsets: str | None) -> str:
    """'' to serve, else why this agent must not start, with the fix."""
    if bad := time_namespace_problem(time_ns, offsets):
        return f"{bad}. Next: {TIME_NS_FIX}"
    if bad := machine_id_problem(machine_id):
        return (f"{bad}: two machines of one host id could then prove each other's owners dead. "
                f"Next: {MACHINE_ID_FIX}")
    return ""
