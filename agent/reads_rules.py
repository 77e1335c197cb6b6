"""Which reads of another process's memory may start, and when one under way counts as stuck.

Reading /proc/PID/environ faults in that process's pages, and the process can make the read wait
forever: a file of a FUSE daemon that never answers, mapped over its environ. Nothing ends such a
read but an answer (or the FUSE connection's abort): its thread stays in the kernel. So a read
that has run STUCK_AFTER_S is given up, its thread *parked* until the read returns, and its
process — by pid and start ticks, since a pid is reused — is refused while that read is pending,
never read a second time. Past MAX_PARKED parked threads no read starts at all. A job given up
MAX_GIVE_UPS times reads nothing more: its last run is refused every read.

Guarantee: repeated reads of a process whose read is pending park no further thread; at most
MAX_PARKED threads are parked, plus the reads already under way when the last was parked (one per
reader thread). A read given up or refused is *unreadable*: a scan meeting it is incomplete and a
probe has no token evidence from it — time only ever makes an answer less certain, never death.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

# An environ read takes microseconds, a page read from swap milliseconds: half a second is no
# read that is merely slow, and a probe waiting on a stuck one answers that much later.
STUCK_AFTER_S = 0.5
MAX_PARKED = 32
# A process whose environ reads stick for STUCK_AFTER_S and then return is not refused once its
# read returned, so a job's run again could be given up on it again, and again, for ever: a few
# KillOwner calls (a coordinator's retries) against such a tree would hold every reader thread, and
# every other session's job would be dropped at its deadline. After this many give-ups the job's
# last run reads nothing (as unreadable), and ends: a kill then kills what it stopped unread.
MAX_GIVE_UPS = 3

# A process: (pid, start ticks).
Identity = tuple[int, int]


def stuck(started: float, now: float) -> bool:
    """Whether a read started at `started` (monotonic seconds) and still under way is stuck."""
    return now - started >= STUCK_AFTER_S


def recheck_in(started: float | None, now: float) -> float:
    """Seconds until the question "is this job's read stuck" is worth asking again: when the read
    under way (None: none) would reach STUCK_AFTER_S."""
    return STUCK_AFTER_S if started is None else max(started + STUCK_AFTER_S - now, 0.0)


@dataclass
class Parked:
    """The processes whose reads were given up and are still pending, with their parked threads."""

    limit: int = MAX_PARKED
    reads: collections.Counter[Identity] = field(default_factory=collections.Counter)
    total: int = 0

    def refusal(self, who: Identity, given_up: int = 0) -> str:
        """Why a read of `who` must not start, in a job given up `given_up` times; "" when it may."""
        if given_up >= MAX_GIVE_UPS:
            return f"this job was given up {given_up} times on stuck reads: its last run reads nothing"
        if who in self.reads:
            return f"a read of pid {who[0]}'s memory is stuck and still pending"
        if self.total >= self.limit:
            return f"{self.total} reads of other processes' memory are stuck: no more are started"
        return ""

    def park(self, who: Identity) -> None:
        self.reads[who] += 1
        self.total += 1

    def unpark(self, who: Identity) -> None:
        """A parked read of `who` returned."""
        self.reads[who] -= 1
        if not self.reads[who]:
            del self.reads[who]
        self.total -= 1
