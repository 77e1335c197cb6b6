"""Which ends of a watch of session records are reconnected after, and how long a watch waits before
it asks again (client/connection.py's `session_events` and the owner's Hold call both follow it).

Guarantee: a watch ends for good only on an answer that cannot pass by asking again — the request
itself malformed (INVALID_ARGUMENT: a bug), the method not served (UNIMPLEMENTED), or the caller's
certificate refused for this session (UNAUTHENTICATED, PERMISSION_DENIED: WRONG_TENANT, WRONG_ROLE).
Every other end is asked again: a coordinator away or restarting, a link silenced (UNAVAILABLE,
CANCELLED, DEADLINE_EXCEEDED), a refusal of the moment (TOO_MANY_CALLS while a silenced call is still
counted, RESOURCE_EXHAUSTED of any kind, etcd unreachable), a handshake failing on a certificate a
renewal replaces. Waiting only ever leads to asking: a reconnect lists the record afresh, it never
takes the silence for an answer. The wait is bounded and jittered: a call no coordinator answered
is asked again after 0.05 s doubling to 2 s (a connection attempt costs a coordinator nothing); an
answered refusal after 0.5 s doubling to 30 s, so thousands of runs refused at once do not come
back at once. No I/O here.
"""

from __future__ import annotations

from enum import Enum

import grpc

# A call ending thus was answered by a coordinator that will answer the same again.
FINAL = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED,
                   grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
# No coordinator's answer: the transport's own ends of a call.
UNANSWERED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.DEADLINE_EXCEEDED})


class Pace(Enum):
    """How soon a watch asks again: (first wait, longest wait) in seconds."""

    AWAY = (0.05, 2.0)      # nothing answered: a coordinator restarting, a link lost
    REFUSED = (0.5, 30.0)   # a coordinator answered, refusing for now


def reconnect(code: grpc.StatusCode, reason: str) -> Pace | None:
    """How a watch ended by `code` (with the coordinator's ErrorInfo `reason`, "" when none came)
    asks again; None when it cannot pass and the watch ends."""
    if code in FINAL:
        return None
    return Pace.AWAY if code in UNANSWERED and not reason else Pace.REFUSED


def wait_s(pace: Pace, attempt: int, spread: float) -> float:
    """The wait before asking again after `attempt` (0 first) failures in a row: the pace's first
    wait doubled per attempt up to its longest, then taken between its half and its whole by
    `spread` (0 ≤ spread < 1, random: runs refused together come back apart)."""
    first, longest = pace.value
    whole = min(first * 2 ** min(attempt, 32), longest)
    return whole / 2 * (1 + spread)
