"""Ending a tree that may keep forking: stop every process found, round after round, until a round
finds none new, and only then kill. Used by the client (its own session's cgroup members) and by
the agent (a token's carriers outside the cgroup).

Guarantee: `stop_until_stable` returns only after a round found nothing new to stop and its reading
was stable (or after STOP_ROUNDS rounds, or its time): a stopped process forks nothing, so a tree
cannot outrun a kill of everything stopped. Every stop and signal is the caller's, through its own
checked pidfds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection

STOP_ROUNDS = 32   # a tree that still forks after 32 rounds of stops is ended by the kill that follows
KILL_WAIT_S = 5.0  # how long a killed tree is given to leave the process table before asking again


def stop_until_stable(find: Callable[[], tuple[Collection[int], bool]],
                      stop: Callable[[set[int]], Collection[int]], seconds: float = math.inf) -> set[int]:
    """`find()`: (the pids of the tree now, whether that reading was stable). `stop(new)`: stops the
    pids not yet stopped and returns those that need no second look. Returns every pid stopped."""
    stopped: set[int] = set()
    deadline = time.monotonic() + seconds
    for _ in range(STOP_ROUNDS):
        found, stable = find()
        new = set(found) - stopped
        if new:
            stopped |= set(stop(new))
        if (not new and stable) or time.monotonic() > deadline:
            break
    return stopped
