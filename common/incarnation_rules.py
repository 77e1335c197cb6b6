"""Whether a recorded host incarnation has ended, judged against a later one of the same host, as a
pure function: the agent applies it to its own incarnation, the fence's recovery to the incarnation
it proved off. Only a new boot of the same machine, or a PID namespace inode given to a new
namespace, proves an end; anything else is unknown (the old namespace may still exist).

Guarantee: "ended" only on a difference the rule can explain. A machine id that names no one
machine (empty, "uninitialized", not 32 hex digits) can be shared by two machines of one host id,
whose differing boot ids then prove nothing: unknown. The start ticks compared are the kernel's
in the initial time namespace's clock: the agent refuses to start where its reads would be shifted
(agent/hostinfo_rules.py).
"""

from __future__ import annotations

import re

from holdfast.v1 import agent_pb2

# machine-id(5): 32 hexadecimal digits; all zero is the null id, "uninitialized" an early boot's.
_MACHINE_ID = re.compile(r"[0-9a-fA-F]{32}")


def machine_id_problem(machine_id: str) -> str:
    """'' when `machine_id` can name one machine, else why not: an empty, uninitialized or
    malformed /etc/machine-id may be the same text on two machines."""
    if not machine_id:
        return "the machine id is empty"
    if not _MACHINE_ID.fullmatch(machine_id):
        return f"the machine id {machine_id[:40]!r} is not 32 hexadecimal digits"
    if not machine_id.strip("0"):
        return "the machine id is the null id (all zero)"
    return ""


def incarnation_verdict(
    recorded: agent_pb2.HostIncarnation, current: agent_pb2.HostIncarnation
) -> tuple[str, str]:
    """('same'|'ended'|'unknown', why). Only a new boot or a reused pid-ns inode proves an end."""
    if recorded == current:
        return "same", ""
    if bad := machine_id_problem(recorded.machine_id) or machine_id_problem(current.machine_id):
        # Two machines without a machine id, under one host id, would prove each other rebooted.
        return "unknown", f"{bad}: it names no one machine, so cannot tell this machine from another"
    if recorded.machine_id != current.machine_id:
        return "unknown", "recorded machine id differs from this host's: maybe a replacement machine"
    if recorded.boot_id != current.boot_id:
        return "ended", "host rebooted (boot id changed)"
    if recorded.pid_ns != current.pid_ns:
        return "unknown", "recorded PID namespace is not the agent's; the old one may still exist"
    if recorded.ns_init_start_ticks != current.ns_init_start_ticks:
        return "ended", "PID namespace inode reused by a new namespace: the old one is gone"
    return "unknown", "incarnation differs in a field the agent cannot interpret"
