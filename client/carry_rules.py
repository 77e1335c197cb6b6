"""The pure rules of carried state (`run --carry`, docs/carry.md): which manifest entries a restore
may write, how carried paths are named and matched, and the per-session cap.

Guarantee: an entry `check_entry` accepts names a path strictly inside its root — relative, no
`..` or `.` segment — and is a regular file or directory with permission bits only (no setuid,
setgid or sticky bit), or a symlink whose relative target does not leave the root as written (the
restore also resolves every restored link on disk: a chain of links is checked as the kernel
follows it). No I/O here.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

CHUNK_BYTES = 512 * 1024  # the coordinator's (holdfast.coordinator.carry); each chunk is one request
KINDS = ("file", "dir", "symlink")


class CarryRefused(ValueError):
    """A path, an entry or a size a carry must not take; the message says which and why."""


def root_name(path: str) -> str:
    """A `--carry PATH` as the manifest records it and a later run matches it: normalised, `~`
    expanded, relative paths kept relative (to run's working directory, on whichever host)."""
    name = os.path.normpath(os.path.expanduser(path))
    if name in (".", "/") or name.startswith("../") or name == "..":
        raise CarryRefused(
            f"--carry {path!r}: name a file or directory below the working directory or by "
            "its absolute path (not '.', '/' or a path through '..')"
        )
    return name


def _segments_inside(path: str) -> bool:
    # The raw segments, not a normalised path: "./x", "a//b" and "/x" name the same file twice or
    # leave the root, and are refused rather than silently made to fit.
    return all(part not in ("..", ".", "") for part in path.split("/"))


def _target_stays_inside(link_path: str, target: str) -> bool:
    depth = len(PurePosixPath(link_path).parts) - 1  # the link's own directory, below the root
    for part in PurePosixPath(target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part != ".":
            depth += 1
    return True


def check_entry(path: str, kind: str, mode: int, link_target: str = "") -> None:
    """Raises CarryRefused for an entry a restore must not write. `path` "" is the root itself."""
    shown = path or "(the carried root)"
    if path and not _segments_inside(path):
        raise CarryRefused(
            f"carry entry {path[:256]!r}: only relative paths without '..' or '.' are restored"
        )
    if kind not in KINDS:
        raise CarryRefused(
            f"carry entry {shown!r}: kind {kind[:16]!r} is not a file, directory or symlink "
            "(device files, FIFOs and sockets are never restored)"
        )
    if mode & ~0o777:
        raise CarryRefused(
            f"carry entry {shown!r}: mode {mode:o} has bits beyond rwx (setuid, setgid and "
            "sticky bits are never restored)"
        )
    if kind == "symlink":
        if not path:
            raise CarryRefused("a carried root is a file or a directory, not a symlink")
        if (
            not link_target
            or PurePosixPath(link_target).is_absolute()
            or not _target_stays_inside(path, link_target)
        ):
            raise CarryRefused(
                f"carry entry {path[:256]!r}: symlink target {link_target[:256]!r} is absolute "
                "or leaves the carried directory"
            )


def check_cap(total_bytes: int, cap: int) -> None:
    if total_bytes > cap:
        raise CarryRefused(
            f"the carried state is {total_bytes} bytes, over the coordinator's per-session cap of {cap} bytes"
        )


def chunked(stream: bytes) -> list[bytes]:
    return [stream[i : i + CHUNK_BYTES] for i in range(0, len(stream), CHUNK_BYTES)]


def age_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
