"""Whether a listing of a procfs holds every process its reader must see, as a pure rule over the
mount's options (a /proc/self/mountinfo) and the reader's groups.

Guarantee: `hidden` returns "" (the listing is whole) only when the kernel lists every process of
the pid namespace to this reader. procfs can leave processes out (fs/proc/base.c): mounted
hidepid=invisible (2), a process the reader may not ptrace-read is missing from the listing and its
/proc/<pid> reads as ENOENT, exactly as a process that has ended — unless the reader is in the
mount's gid= group; mounted hidepid=ptraceable (4), the same, and gid= exempts no one. An agent
without CAP_SYS_PTRACE, or one an LSM denies, would then see a live tree as no process at all, and a
scan of that listing would call it gone. hidepid=noaccess (1) lists every process and refuses its
reads (EPERM): those count as unreadable, like any process whose environ cannot be read, so the
listing is whole. subset=pid lists every process but hides /proc/loadavg, whose pid counter a scan
needs to see a wrap (proc/scan.py `pids_ascended`): no listing of it can be trusted as whole. An
option this rule does not know, or a mount it cannot find, is taken as hiding.
"""

from __future__ import annotations

from collections.abc import Collection

PROCFS = "proc"
FIX = ("mount a /proc for the agent without hidepid (a mount namespace of its own; in a container, the "
       "runtime's /proc has none), or run it in the mount's gid= group (hidepid=invisible only): until "
       "then no scan proves a tree gone, and every session whose end needs one waits")
# hidepid values that keep a process out of the listing, with whether gid= exempts its members.
_HIDING = {"2": True, "invisible": True, "4": False, "ptraceable": False}
_LISTING_ALL = {"0", "off", "1", "noaccess"}


def _unescape(field: str) -> str:
    """A mountinfo field: space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_of(mountinfo: str, device: tuple[int, int]) -> list[tuple[str, str, dict[str, str]]]:
    """(mount point, filesystem type, super options) of every mount of the device (major, minor)."""
    found = []
    needle = f" {device[0]}:{device[1]} "
    for line in mountinfo.splitlines():
        if needle not in line:  # a node's thousands of mounts, read at every scan
            continue
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        major, _, minor = fields[2].partition(":")
        if (major, minor) != (str(device[0]), str(device[1])):
            continue
        options = dict(o.partition("=")[::2] for o in tail[2].split(",") if o)
        found.append((_unescape(fields[4]), tail[0], options))
    return found


def hidden(mountinfo: str, device: tuple[int, int], groups: Collection[int]) -> str:
    """Why a listing of the directory on `device` (the st_dev of the /proc the reader lists) may
    leave out a process from a reader in `groups` (its fsgid and supplementary groups); "" when it
    leaves none out. A device whose mounts are no procfs (a directory standing in for one) hides
    nothing; one no line names cannot be told: hiding."""
    mounts = mounts_of(mountinfo, device)
    if not mounts:
        return (f"no mount of device {device[0]}:{device[1]} in /proc/self/mountinfo: whether its "
                "listing hides processes cannot be told")
    procfs = [(point, options) for point, kind, options in mounts if kind == PROCFS]
    if not procfs:
        return ""
    # Options are the superblock's: every mount of one procfs shows the same.
    point, options = procfs[-1]
    hidepid = options.get("hidepid", "off")
    if "subset" in options:
        return (f"{point} is mounted subset={options['subset']}: it hides /proc/loadavg, so a scan cannot "
                "see the pid counter wrap under its listing")
    if hidepid in _LISTING_ALL:
        return ""
    if hidepid not in _HIDING:
        return f"{point} is mounted hidepid={hidepid}, which this agent does not know: taken as hiding"
    gid = options.get("gid", "")
    if _HIDING[hidepid] and gid.isdigit() and int(gid) in groups:
        return ""
    exempt = " (its gid= group exempts no one)" if not _HIDING[hidepid] else \
        f" and this agent is not in its gid= group ({gid or 'none set'})"
    return (f"{point} is mounted hidepid={hidepid}{exempt}: a live process this agent may not "
            "ptrace-read is missing from its listing and reads as ended")
