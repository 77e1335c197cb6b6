"""Whether a recorded host incarnation has ended, judged against a later one of the same host, as a
pure function: the agent applies it to its own incarnation, the fence's recovery to the incarnation
it proved off. Only a new boot of the same machine, or a PID namespace inode given to a new
namespace, proves an end; anything else is unknown (the old namespace may still exist).
"""

from __future__ import annotations

from holdfast.v1 import agent_pb2


def incarnation_verdict(
    recorded: agent_pb2.HostIncarnation, current: agent_pb2.HostIncarnation
) -> tuple[str, str]:
    """('same'|'ended'|'unknown', why). Only a new boot or a reused pid-ns inode proves an end."""
    if recorded == current:
        return "same", ""
    if recorded.machine_id != current.machine_id:
        return "unknown", "recorded machine id differs from this host's: maybe a replacement machine"
    if recorded.boot_id != current.boot_id:
        return "ended", "host rebooted (boot id changed)"
    if recorded.pid_ns != current.pid_ns:
        return "unknown", "recorded PID namespace is not the agent's; the old one may still exist"
    if recorded.ns_init_start_ticks != current.ns_init_start_ticks:
        return "ended", "PID namespace inode reused by a new namespace: the old one is gone"
    return "unknown", "incarnation differs in a field the agent cannot interpret"
