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
kernel without time namespaces, so every start time it reads or records is in that one clock; and
only with a machine id that names one machine (common/incarnation_rules.py).
"""

from __future__ import annotations

from holdfast.common.incarnation_rules import machine_id_problem

INIT_TIME_NS = 4026531834  # PROC_TIME_INIT_INO: the inode of the initial time namespace
CLOCKS = ("monotonic", "boottime")  # the clocks /proc/self/timens_offsets lists, one line each

TIME_NS_FIX = ("run the agent in the host's initial time namespace: no `unshare --time`, no time "
               "namespace or linux.timeOffsets in its container's OCI spec; restart it rather than "
               "restore a checkpoint of it (CRIU)")
MACHINE_ID_FIX = ("give the machine a unique /etc/machine-id (`systemd-machine-id-setup`, or "
                  "`dbus-uuidgen > /etc/machine-id`) and mount the node's own into the agent's container")


def parse_offsets(text: str) -> dict[str, tuple[int, int]] | None:
    """/proc/PID/timens_offsets ("<clock> <seconds> <nanoseconds>" a line, the clock by name) as
    {clock: (seconds, nanoseconds)}; None when a line is not of that form."""
    offsets = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        try:
            clock, seconds, nanoseconds = fields
            offsets[clock] = (int(seconds), int(nanoseconds))
        except ValueError:
            return None
    return offsets


def time_namespace_problem(time_ns: int | None, offsets: str | None) -> str:
    """'' when the start times this process reads are in the initial time namespace's clock, else
    why not. `time_ns` is /proc/self/ns/time's inode and `offsets` /proc/self/timens_offsets, None
    when absent: both absent, a kernel without time namespaces, has one clock."""
    if time_ns is None and offsets is None:
        return ""
    parsed = parse_offsets(offsets or "")
    if parsed is None or any(clock not in parsed for clock in CLOCKS):
        return (f"/proc/self/timens_offsets is unreadable or not one '<clock> <seconds> <nanoseconds>' "
                f"line per clock ({offsets!r}): the clock this agent reads start times in is unknown")
    shifted = [f"{clock} {s}s {ns}ns" for clock, (s, ns) in parsed.items() if (s, ns) != (0, 0)]
    if shifted:
        return (f"this agent runs in a time namespace with offsets ({', '.join(shifted)}): the kernel "
                "shifts every start time it reads in /proc/<pid>/stat by them, so it would judge a live "
                "owner recorded by an agent without them another process, and its host ended")
    if time_ns != INIT_TIME_NS:
        return (f"this agent runs in time namespace {time_ns}, not the initial one ({INIT_TIME_NS}): its "
                "offsets are zero now, but a checkpoint restore re-creates it with offsets while the "
                "agent runs, shifting every start time it reads from then on")
    return ""


def refusal(machine_id: str, time_ns: int | None, offsets: str | None) -> str:
    """'' to serve, else why this agent must not start, with the fix."""
    if bad := time_namespace_problem(time_ns, offsets):
        return f"{bad}. Next: {TIME_NS_FIX}"
    if bad := machine_id_problem(machine_id):
        return (f"{bad}: two machines of one host id could then prove each other's owners dead. "
                f"Next: {MACHINE_ID_FIX}")
    return ""
