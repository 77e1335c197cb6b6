"""A recorded fault-test history and the checker that judges it, independent of holdfast's own state.

Evidence comes from outside holdfast: children append their (session, fence, host, pid, seq)
writes, the per-session `flock` detector logs any failure to get the lock, and the harness logs
each tree's start and observed end from the hosts' process tables. The checker trusts none of
holdfast's answers except acknowledgements, which are exactly what it must hold holdfast to.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

EventKind = Literal[
    "grant",          # a fence was granted for a session
    "tree-start",     # a child tree for (session, fence) was seen running (process table)
    "tree-end",       # that tree was seen gone (process table)
    "flock-failed",   # a child could not take the session's exclusive lock: two trees overlapped
    "put-ack",        # FencedPut acknowledged: (session, fence, key) is durable
    "put-stale-ack",  # a FencedPut with a fence older than the record's was acknowledged
    "indeterminate-grant",  # a grant whose recorded evidence was an indeterminate probe
    "final-key",      # a key present in the store at the end of the run
    "uncommitted-cmd-ran",  # a CMD whose parent died between Acquire and commit ran anyway
]


@dataclass(frozen=True)
class Event:
    seq: int
    kind: EventKind
    session: str
    fence: int = 0
    host: str = ""
    key: str = ""


@dataclass
class Violation:
    rule: str
    session: str
    events: list[Event] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.rule} (session {self.session}):"]
        lines += [f"  #{e.seq} {e.kind} fence={e.fence} host={e.host} {e.key}".rstrip() for e in self.events]
        return "\n".join(lines)


def check(history: list[Event]) -> list[Violation]:
    """Every violation of the product's promises in `history`, each with the slice that shows it."""
    ordered = sorted(history, key=lambda e: e.seq)
    by_session: dict[str, list[Event]] = defaultdict(list)
    for event in ordered:
        by_session[event.session].append(event)
    violations: list[Violation] = []
    for session, events in by_session.items():
        violations += _fences_strictly_increase(session, events)
        violations += _one_tree_at_a_time(session, events)
        violations += _flagged(session, events)
        violations += _acknowledged_writes_kept(session, events)
    return violations


def _fences_strictly_increase(session: str, events: list[Event]) -> list[Violation]:
    # A session's first fence is 1: a tree started at fence 0 (with no grant at all) is no new fence
    # either, even as the first of its session.
    grants = [Event(0, "grant", session, 0), *(e for e in events if e.kind == "grant")]
    return [Violation("fence did not strictly increase", session, [before, after])
            for before, after in itertools.pairwise(grants) if after.fence <= before.fence]


def _one_tree_at_a_time(session: str, events: list[Event]) -> list[Violation]:
    running: dict[int, Event] = {}
    violations = []
    for event in events:
        if event.kind == "tree-start":
            if running:
                violations.append(Violation("two trees alive at once", session, [*running.values(), event]))
            running[event.fence] = event
        elif event.kind == "tree-end":
            running.pop(event.fence, None)
    return violations


def _flagged(session: str, events: list[Event]) -> list[Violation]:
    rules = {"flock-failed": "two trees held the session lock at once",
             "put-stale-ack": "a stale-fence write was accepted",
             "indeterminate-grant": "an indeterminate probe led to a grant",
             "uncommitted-cmd-ran": "a CMD ran without its commit (spawn gate)"}
    return [Violation(rules[e.kind], session, [e]) for e in events if e.kind in rules]


def _acknowledged_writes_kept(session: str, events: list[Event]) -> list[Violation]:
    present = {e.key for e in events if e.kind == "final-key"}
    return [Violation("an acknowledged write was lost", session, [e])
            for e in events if e.kind == "put-ack" and e.key not in present]
