"""Reading one process's environment and finding one variable in it, exactly.

A token may stand after hundreds of KB of other variables, so the block is read whole. A match is
exact: `VAR=` at the start of an entry, never the prefix of `VAR_EXTRA=`. Nothing but that one
value ever leaves this module.

Reading another process's environ (or cmdline) faults in that process's memory, and a process can
make that wait forever (a file of a FUSE daemon that never answers, mapped over its environ): the
agent reads it only through a guard (agent/reads.py), passed in as an `EnvironReader`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_CHUNK = 1 << 16


def read_proc_file(path: str) -> bytes:
    """The whole file, however large; raises OSError as the kernel reports it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.read(fd, _CHUNK)
        if len(first) < _CHUNK:
            # procfs fills a read up to the end of the data: a short read is the whole file,
            # which saves the EOF read on the common small environ.
            return first
        parts = [first]
        while chunk := os.read(fd, _CHUNK):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def value_in_block(block: bytes, variable: bytes) -> bytes | None:
    """The value of `variable` in a NUL-separated environ block, or None when it is absent."""
    needle = variable + b"="
    if block.startswith(needle):
        start = len(needle)
    else:
        at = block.find(b"\0" + needle)
        if at < 0:
            return None
        start = at + 1 + len(needle)
    end = block.find(b"\0", start)
    return block[start:] if end < 0 else block[start:end]


def read_environ(pid: int | str, proc: str = "/proc") -> bytes | None:
    """`pid`'s environ block; None when it has none (a kernel thread, a reaped or plain zombie).

    A leader that called pthread_exit is a zombie whose environ reads ESRCH while its threads
    run on: their task entries still share the memory, so it is read through them.
    Raises OSError (ENOENT when gone, EACCES/EPERM/EIO when it may not be read).
    """
    try:
        return read_proc_file(f"{proc}/{pid}/environ")
    except ProcessLookupError:
        for tid in os.listdir(f"{proc}/{pid}/task"):
            if tid != str(pid):
                try:
                    return read_proc_file(f"{proc}/{pid}/task/{tid}/environ")
                except ProcessLookupError:
                    continue
        return None


# (pid, its start ticks when the caller read them, else None; the proc root) -> `read_environ`'s answer.
EnvironReader = Callable[[int | str, int | None, str], bytes | None]


def plain_environ(pid: int | str, start_ticks: int | None, proc: str) -> bytes | None:
    """`read_environ` unguarded, for a reader that may wait on its own host's processes (a CLI)."""
    return read_environ(pid, proc)


def read_value(pid: int, variable: bytes, environ: EnvironReader = plain_environ) -> bytes | None:
    """The variable's value in `pid`'s environ; raises OSError when it cannot be read."""
    block = environ(pid, None, "/proc")
    return None if block is None else value_in_block(block, variable)
