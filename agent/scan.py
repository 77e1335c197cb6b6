"""One pass over /proc: every process carrying a variable, which of them are tree roots, and
whether the pass could read every live process (`complete`).

A process that vanished mid-scan is simply gone; one whose environ could not be read is counted
unreadable, so "no carrier" is never claimed over processes the agent could not look at.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from holdfast.agent.environ import read_environ, read_proc_file, value_in_block
from holdfast.agent.procstat import StatParseError, parse_stat


@dataclass(frozen=True)
class Carrier:
    pid: int
    ppid: int
    token: bytes
    root: bool


@dataclass
class Scan:
    enumerable: bool
    scanned: int = 0
    unreadable: int = 0
    carriers: list[Carrier] = field(default_factory=list)
    # Start ticks of each unreadable process, None where its stat could not be read either.
    unreadable_started: list[int | None] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.enumerable and self.unreadable == 0

    def unreadable_since(self, root_start_ticks: int) -> int:
        """Unreadable processes that could belong to a tree whose root started at these ticks.

        A descendant is born after its root, so an unreadable process that started strictly
        earlier cannot be one (a pid namespace's init, unreadable inside many containers, would
        otherwise make every tree unprovable). One started in the same tick, or with no readable
        stat, still counts: it could be a member. Ticks 0 (no root) counts everything.
        """
        if root_start_ticks <= 0:
            return self.unreadable
        return sum(1 for ticks in self.unreadable_started if ticks is None or ticks >= root_start_ticks)

    def of_token(self, token: bytes) -> list[Carrier]:
        return [c for c in self.carriers if c.token == token]


def _start_ticks(entry: str, proc: str) -> int | None:
    try:
        return parse_stat(read_proc_file(f"{proc}/{entry}/stat")).start_ticks
    except (OSError, StatParseError):
        return None


def scan(variable: bytes, token: bytes | None = None, proc: str = "/proc") -> Scan:
    """Carriers of `variable` (only those equal to `token` when given), roots marked."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return Scan(enumerable=False)
    result = Scan(enumerable=True)
    found: dict[int, bytes] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            block = read_environ(entry, proc)
        except FileNotFoundError:
            continue  # exited mid-scan
        except OSError:
            # EACCES/EPERM/EIO: alive but unreadable; absence claims are off for this scan.
            result.scanned += 1
            result.unreadable += 1
            result.unreadable_started.append(_start_ticks(entry, proc))
            continue
        if block is None:
            continue  # kernel thread or zombie: no memory, no environment, nothing runs
        result.scanned += 1
        value = value_in_block(block, variable)
        if value is not None and (token is None or value == token):
            found[int(entry)] = value
    for pid, value in found.items():
        try:
            ppid = parse_stat(read_proc_file(f"{proc}/{pid}/stat")).ppid
        except (OSError, StatParseError):
            continue  # gone since its environ was read
        result.carriers.append(Carrier(pid, ppid, value, root=found.get(ppid) != value))
    return result
