"""This process's time namespace, as common/timens_rules.py judges it."""

from __future__ import annotations

import os

from holdfast.common.timens_rules import time_namespace_problem


def time_namespace() -> tuple[int | None, str | None]:
    """This process's time namespace inode and its /proc/self/timens_offsets, each None when absent
    (a kernel without time namespaces)."""
    try:
        inode: int | None = os.stat("/proc/self/ns/time").st_ino
    except OSError:
        inode = None
    try:
        with open("/proc/self/timens_offsets") as f:
            offsets: str | None = f.read()
    except OSError:
        offsets = None
    return inode, offsets


def problem() -> str:
    """'' when the start times this process reads are every reader's (timens_rules), else why not."""
    return time_namespace_problem(*time_namespace())
