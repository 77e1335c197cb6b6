"""The spawn gate (docs/design.md §2): CMD runs only after its commit succeeded.

Guarantee: the gate is `/bin/sh` exec'd with the spawn token already in its environment, blocked
on a pipe whose only write end this process holds. It execs CMD (same pid, same start ticks, the
token inherited) only when it reads exactly "committed"; any other outcome — `abort()`, a closed
pipe because this process died, a stray line — ends it without running CMD. Spawning is
fork+exec through `subprocess` with `pass_fds` only: no `preexec_fn`, no multiprocessing, so it
is safe beside gRPC's threads.

A gate spawned before its grant (commit at grant) cannot have CMD's fence in its environment: it
inherits a memory file (memfd_create: no name in any directory), which `release` writes (values
quoted for the shell) before the word, and which the gate sources through `/dev/fd/N` — that very
file, never a path: a grant directory in a TMPDIR another user may write could be swapped for
theirs, and root would source their file — after reading the word and before the exec; text that
does not source cleanly ends the gate without running CMD. CMD inherits that descriptor too,
read-only; it holds only what CMD's environment already holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import StatParseError, parse_stat

if TYPE_CHECKING:
    from holdfast.v1 import agent_pb2

COMMITTED = b"committed\n"
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def gate_argv(read_fd: int, argv: Sequence[str], env_fd: int | None = None) -> list[str]:
    """The shell program: read one line from `read_fd`, exec CMD only if it says committed (after
    sourcing the file open as `env_fd`, when given).

    The pipe is read through `/dev/fd/N` because dash (Debian's /bin/sh) parses only one-digit
    descriptors in `<&N`, and a process running gRPC holds fds 3..12 already. So CMD inherits
    that read end, drained and at EOF once the parent closed its write end: harmless.
    """
    committed = f'IFS= read -r go </dev/fd/{read_fd} && [ "$go" = committed ]'
    sourced = "" if env_fd is None else f" && . /dev/fd/{env_fd}"
    return ["/bin/sh", "-c", f'{committed}{sourced} && exec "$@"', "holdfast-gate", *argv]


def env_file_text(values: Mapping[str, str]) -> str:
    """`export NAME='value'` lines for the shell to source: every value quoted, whatever it holds."""
    for name in values:
        if not SHELL_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a shell variable name")
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


class Gate:
    """One gated child. The write end of its pipe never leaves this process (it is close-on-exec)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                 process_group: int | None = None, env_at_release: bool = False) -> None:
        if not argv:
            raise ValueError("a gate needs a command to run")
        self._env_fd = os.memfd_create("holdfast-gate-env", os.MFD_CLOEXEC) if env_at_release else -1
        read_fd, self._write_fd = os.pipe()  # both non-inheritable; pass_fds opens only the read end
        # The gate and CMD hold the memory file read-only: a descriptor open for writing on a file
        # the agent cannot place in a mount it knows could be a cgroup.procs, and costs an
        # unprivileged tree its proof by the cgroup alone (proc/cgroups_rules.py).
        env_fd = (os.open(f"/proc/self/fd/{self._env_fd}", os.O_RDONLY | os.O_CLOEXEC)
                  if env_at_release else None)
        try:
            self.process = subprocess.Popen(
                gate_argv(read_fd, argv, env_fd), env=dict(env), cwd=cwd,
                pass_fds=(read_fd,) if env_fd is None else (read_fd, env_fd),
                process_group=process_group, close_fds=True,
            )
        except BaseException:
            self._close()
            raise
        finally:
            for fd in (read_fd, env_fd):
                if fd is not None:
                    os.close(fd)

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_process(self, owner: agent_pb2.ProcessIdentity) -> bool:
        """Whether an agent's attested identity is this very gate: by its pidfs inode when it was
        attested with one (one per process for the boot, in every pid namespace), else by pid and
        start ticks (the agent's pid namespace being this one). Another gate may carry the same
        token (a reservation replayed to two runs), so the token alone does not say."""
        try:
            if owner.pidfd_ino:
                fd = os.pidfd_open(self.pid)
                try:
                    return os.fstat(fd).st_ino == owner.pidfd_ino
                finally:
                    os.close(fd)
            stat = parse_stat(read_proc_file(f"/proc/{self.pid}/stat"))
            return owner.pid == self.pid and stat.start_ticks == owner.start_ticks
        except (OSError, StatParseError):
            return False

    def release(self, grant_env: Mapping[str, str] | None = None) -> None:
        """Let the gate exec CMD, with `grant_env` added to its environment (a gate spawned with
        `env_at_release` only). Call only after the commit succeeded."""
        try:
            if self._env_fd >= 0:
                text = env_file_text(grant_env or {}).encode()
                while text:
                    text = text[os.write(self._env_fd, text):]
            elif grant_env:
                raise ValueError("this gate's environment was fixed at its spawn")
            os.write(self._write_fd, COMMITTED)
        finally:
            self._close()

    def abort(self) -> None:
        """End the gate without CMD ever running: EOF on the pipe fails its `read`."""
        self._close()

    def _close(self) -> None:
        for fd in (self._write_fd, self._env_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._write_fd = self._env_fd = -1
