"""client.watch_rules: which ends of a watch are asked again, and how soon."""

from __future__ import annotations

import grpc
import pytest

from holdfast.client.watch_rules import Pace, reconnect, wait_s
from holdfast.common.reasons import Reason

C = grpc.StatusCode


@pytest.mark.parametrize(("code", "reason"), [
    (C.RESOURCE_EXHAUSTED, Reason.TOO_MANY_CALLS),  # a silenced call still counted: it ends by keepalive
    (C.RESOURCE_EXHAUSTED, ""),                     # gRPC's own (a message too large, a server's quota)
    (C.UNAVAILABLE, Reason.UNAVAILABLE),            # the coordinator cannot reach etcd now
    (C.FAILED_PRECONDITION, Reason.RESTORE_PENDING),
    (C.INTERNAL, ""),
    (C.UNKNOWN, ""),
    (C.ABORTED, ""),
])
def test_an_answered_refusal_of_the_moment_is_asked_again_slowly(code: grpc.StatusCode, reason: str) -> None:
    assert reconnect(code, reason) is Pace.REFUSED


@pytest.mark.parametrize("code", [C.UNAVAILABLE, C.CANCELLED, C.DEADLINE_EXCEEDED])
def test_a_call_nobody_answered_is_asked_again_soon(code: grpc.StatusCode) -> None:
    # Among them a handshake failing on an expired certificate, which the run's renewal replaces.
    assert reconnect(code, "") is Pace.AWAY


@pytest.mark.parametrize(("code", "reason"), [
    (C.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT),  # the request itself: a bug
    (C.UNIMPLEMENTED, ""),
    (C.PERMISSION_DENIED, Reason.WRONG_TENANT),
    (C.PERMISSION_DENIED, Reason.WRONG_ROLE),
    (C.UNAUTHENTICATED, Reason.UNAUTHENTICATED),
])
def test_an_answer_that_cannot_pass_ends_the_watch(code: grpc.StatusCode, reason: str) -> None:
    assert reconnect(code, reason) is None


@pytest.mark.parametrize("pace", list(Pace))
def test_the_wait_doubles_to_its_bound_and_is_spread_over_its_upper_half(pace: Pace) -> None:
    first, longest = pace.value
    assert wait_s(pace, 0, 0.0) == first / 2
    assert wait_s(pace, 0, 0.999) < first
    assert wait_s(pace, 1, 0.0) == first
    waits = [wait_s(pace, n, 0.999) for n in range(100)]
    assert waits == sorted(waits) and max(waits) < longest  # 100 failures: no overflow, still bounded
    assert wait_s(pace, 100, 0.0) == longest / 2
    assert Pace.REFUSED.value == (0.5, 30.0)
