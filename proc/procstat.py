"""Parsing /proc/<pid>/stat: state, parent and start ticks, immune to odd process names.

The command name sits in parentheses and may itself contain `)` or spaces, so fields are counted
after the LAST `)`. Start ticks (field 22) are raw clock ticks since boot: exact integer compare.
"""

from __future__ import annotations

from dataclasses import dataclass

PF_KTHREAD = 0x00200000


@dataclass(frozen=True)
class ProcStat:
    state: str
    ppid: int
    start_ticks: int
    flags: int = 0
    # Where the environ lies in the process's memory (fields 50-51; 0 without ptrace access, while
    # an execve has not laid it out yet, or once the memory is gone on exit).
    env_start: int = 0
    env_end: int = 0

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def started_without_environ(self) -> bool:
        """Its environ is laid out and empty (`env -i`): known to carry nothing."""
        return self.env_start != 0 and self.env_start == self.env_end


class StatParseError(ValueError):
    """The stat line does not have the shape the kernel documents."""


def parse_stat(line: bytes) -> ProcStat:
    close = line.rfind(b")")
    if close < 0:
        raise StatParseError("no ')' closing the command name")
    fields = line[close + 1 :].split()
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    if len(fields) < 20:
        raise StatParseError(f"only {len(fields) + 2} fields")
    try:
        env = (int(fields[47]), int(fields[48])) if len(fields) > 48 else (0, 0)
        return ProcStat(state=fields[0].decode(), ppid=int(fields[1]), start_ticks=int(fields[19]),
                        flags=int(fields[6]), env_start=env[0], env_end=env[1])
    except (ValueError, UnicodeDecodeError) as exc:
        raise StatParseError(str(exc)) from exc
