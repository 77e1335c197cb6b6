"""The spawn gate (docs/design.md §2): CMD runs only after its commit succeeded.

Guarantee: the gate is `/bin/sh` exec'd with the spawn token already in its environment, blocked
on a pipe whose only write end this process holds. It execs CMD (same pid, same start ticks, the
token inherited) only when it reads exactly "committed"; any other outcome — `abort()`, a closed
pipe because this process died, a stray line — ends it without running CMD. Spawning is
fork+exec through `subprocess` with `pass_fds` only: no `preexec_fn`, no multiprocessing, so it
is safe beside gRPC's threads.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence

COMMITTED = b"committed\n"


def gate_argv(read_fd: int, argv: Sequence[str]) -> list[str]:
    """The shell program: read one line from `read_fd`, exec CMD only if it says committed.

    The pipe is read through `/dev/fd/N` because dash (Debian's /bin/sh) parses only one-digit
    descriptors in `<&N`, and a process running gRPC holds fds 3..12 already. So CMD inherits
    that read end, drained and at EOF once the parent closed its write end: harmless.
    """
    script = f'IFS= read -r go </dev/fd/{read_fd} && [ "$go" = committed ] && exec "$@"'
    return ["/bin/sh", "-c", script, "holdfast-gate", *argv]


class Gate:
    """One gated child. The write end of its pipe never leaves this process (it is close-on-exec)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                 process_group: int | None = None) -> None:
        if not argv:
            raise ValueError("a gate needs a command to run")
        read_fd, self._write_fd = os.pipe()  # both non-inheritable; pass_fds opens only the read end
        try:
            self.process = subprocess.Popen(
                gate_argv(read_fd, argv), env=dict(env), cwd=cwd, pass_fds=(read_fd,),
                process_group=process_group, close_fds=True,
            )
        except BaseException:
            os.close(self._write_fd)
            raise
        finally:
            os.close(read_fd)

    @property
    def pid(self) -> int:
        return self.process.pid

    def release(self) -> None:
        """Let the gate exec CMD. Call only after the commit succeeded."""
        try:
            os.write(self._write_fd, COMMITTED)
        finally:
            self._close()

    def abort(self) -> None:
        """End the gate without CMD ever running: EOF on the pipe fails its `read`."""
        self._close()

    def _close(self) -> None:
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = -1
