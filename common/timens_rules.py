"""Whether the start times a process reads in /proc/<pid>/stat are in the one clock every other
reader on the machine uses: a pure rule over what common/timens.py read.

The kernel (Linux >= 5.6) shifts every start time read there by the *reader's* time namespace's
boottime offset. A reader under another offset (`unshare --time`, an OCI `linux.timeOffsets`, a
checkpoint restored by CRIU) reads a live process's start as other than a reader without one does,
and would judge it another process: a live owner dead (the agent), a live run's grant directory a
dead run's (client/grantdir.py).

Guarantee: `time_namespace_problem` is '' only in the initial time namespace with zero offsets
(which cannot be changed, and which a running process cannot be moved out of by anyone but itself),
or on a kernel without time namespaces (one clock); anything it cannot read is a problem.
"""

from __future__ import annotations

INIT_TIME_NS = 4026531834  # PROC_TIME_INIT_INO: the inode of the initial time namespace
CLOCKS = ("monotonic", "boottime")  # the clocks /proc/self/timens_offsets lists, one line each


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
                f"line per clock ({offsets!r}): the clock this process reads start times in is unknown")
    shifted = [f"{clock} {s}s {ns}ns" for clock, (s, ns) in parsed.items() if (s, ns) != (0, 0)]
    if shifted:
        return (f"this process runs in a time namespace with offsets ({', '.join(shifted)}): the kernel "
                "shifts every start time it reads in /proc/<pid>/stat by them, so it would judge a live "
                "process started before, as read without them, another process")
    if time_ns != INIT_TIME_NS:
        return (f"this process runs in time namespace {time_ns}, not the initial one ({INIT_TIME_NS}): "
                "its offsets are zero now, but a checkpoint restore re-creates it with offsets while it "
                "runs, shifting every start time it reads from then on")
    return ""
