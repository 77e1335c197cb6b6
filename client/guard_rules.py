"""The pure judgements of the dir:// guard (client/guards.py): the `?cap_bytes=N` it takes, and who
holds its `.lock` by the kernel's list of locks.

Guarantee: `cap_bytes` accepts only 1 to 19 ASCII digits naming a number above zero — never a
digit of another script (Arabic-Indic 10), a superscript (`²`) or thousands of digits — and says what it
takes otherwise, so a malformed URL is a refusal naming the parameter, never an uncaught
ValueError. `flock_holders` names only the pids holding a lock on that file, never one waiting
for it. No I/O here: guards.py reads /proc.
"""

from __future__ import annotations

import re

_CAP = re.compile(r"[0-9]{1,19}")


def cap_bytes(value: str) -> int | None:
    """The bytes `cap_bytes=<value>` names, or None unless it is a number of 1 to 19 ASCII digits
    above zero (str.isdigit took `²`, then int() raised; and Arabic-Indic digits as 10)."""
    if _CAP.fullmatch(value) is None or int(value) <= 0:
        return None
    return int(value)


def flock_holders(proc_locks: str, major: int, minor: int, inode: int) -> list[int]:
    """The pids /proc/locks (its text `proc_locks`) shows holding an flock on the file of that
    device and inode; a line `N: -> FLOCK …` is a process waiting for the lock, not holding it."""
    wanted = f"{major:02x}:{minor:02x}:{inode}"
    holders = []
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != wanted:
            continue
        if fields[4].isascii() and fields[4].isdigit():
            holders.append(int(fields[4]))
    return holders
