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
option this rule does not know, or a mount it cannot find, is taken as hiding. So is a mount over a
file under the listed procfs that a scan reads (`_overmounts`): over /proc/loadavg (LXCFS mounts
its own, whose pid counter is another's or a cached value) a wrap goes unseen; over /proc/<pid> or
anything in it, a process's stat or environ read there is whatever the mounted file says, and a
live carrier reads as none.
"""

from __future__ import annotations

from collections.abc import Collection

PROCFS = "proc"
FIX = ("mount a /proc for the agent without hidepid (a mount namespace of its own; in a container, the "
       "runtime's /proc has none), or run it in the mount's gid= group (hidepid=invisible only), and "
       "mount nothing over /proc/loadavg or /proc/<pid> in its mount namespace (no LXCFS /proc files): "
       "until then no scan proves a tree gone, and every session whose end needs one waits")
# What a scan reads under the listed procfs besides its <pid> directories: the pid counter.
_COUNTER = "loadavg"
# hidepid values that keep a process out of the listing, with whether gid= exempts its members.
_HIDING = {"2": True, "invisible": True, "4": False, "ptraceable": False}
_LISTING_ALL = {"0", "off", "1", "noaccess"}


# A mountinfo field: space, tab, newline and backslash are written as octal escapes.
_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}


def _unescape(field: str) -> str:
    for char, code in _ESCAPES.items():
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


def _overmounts(mountinfo: str, listed: str) -> list[str]:
    """The mount points strictly under `listed` (the path the reader lists, as mountinfo names it)
    over what a scan reads there: its loadavg, a /<pid> directory or anything in one."""
    prefix = listed.rstrip("/") + "/"
    needle = " " + "".join(_ESCAPES.get(char, char) for char in prefix)
    found: list[str] = []
    if needle not in mountinfo:  # a node's thousands of mounts, read at every scan: most have none
        return found
    for line in mountinfo.splitlines():
        if needle not in line:
            continue
        fields = line.split(" ", 5)
        point = _unescape(fields[4]) if len(fields) > 4 else ""
        under = point[len(prefix):].split("/")[0] if point.startswith(prefix) else ""
        if under == _COUNTER or under.isdigit():
            found.append(point)
    return found


_UNLISTED = "no mount of device"


def unlisted(why: str) -> bool:
    """Whether `why` (a `hidden` answer) is that no line of the mount table named the device."""
    return why.startswith(_UNLISTED)


def hidden(mountinfo: str, device: tuple[int, int], groups: Collection[int], listed: str = "/proc") -> str:
    """Why a listing of the directory on `device` (the st_dev of the /proc the reader lists, at the
    path `listed`) may leave out a process from a reader in `groups` (its fsgid and supplementary
    groups), or let a scan read another's file as a process's own; "" when neither. A device whose
    mounts are no procfs (a directory standing in for one) hides nothing; one no line names cannot
    be told: hiding."""
    mounts = mounts_of(mountinfo, device)
    if not mounts:
        return (f"{_UNLISTED} {device[0]}:{device[1]} in /proc/self/mountinfo: whether its listing hides "
                "processes cannot be told")
    procfs = [(point, options) for point, kind, options in mounts if kind == PROCFS]
    if not procfs:
        return ""
    if over := _overmounts(mountinfo, listed):
        more = f" and {len(over) - 1} more" if len(over) > 1 else ""
        return (f"{over[0]}{more} is mounted over what a scan reads in {listed}: the pid counter, or a "
                "process's stat and environ, read there may be another's, and a live carrier read as none")
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
