"""The checker finds each kind of violation, shows the slice that proves it, and passes a clean run."""

from __future__ import annotations

import pytest

from tests.faults.history import Event, check


def _clean() -> list[Event]:
    return [
        Event(1, "grant", "s", fence=1, host="a"),
        Event(2, "tree-start", "s", fence=1, host="a"),
        Event(3, "put-ack", "s", fence=1, key="s/1/1"),
        Event(4, "tree-end", "s", fence=1, host="a"),
        Event(5, "grant", "s", fence=2, host="b"),
        Event(6, "tree-start", "s", fence=2, host="b"),
        Event(7, "put-ack", "s", fence=2, key="s/2/1"),
        Event(8, "tree-end", "s", fence=2, host="b"),
        Event(9, "final-key", "s", key="s/1/1"),
        Event(10, "final-key", "s", key="s/2/1"),
    ]


def test_a_clean_history_has_no_violation() -> None:
    assert check(_clean()) == []


@pytest.mark.parametrize(("broken", "rule"), [
    # A rule build that re-granted the same fence (a broken next_fence).
    (lambda h: [*h[:4], Event(5, "grant", "s", fence=1, host="b"), *h[5:]],
     "fence did not strictly increase"),
    # B's tree started before A's was seen gone.
    (lambda h: [*h[:3], Event(4, "grant", "s", fence=2, host="b"),
                Event(5, "tree-start", "s", fence=2, host="b"),
                Event(6, "tree-end", "s", fence=1, host="a"), *h[6:]],
     "two trees alive at once"),
    # A tree started with no grant at all, the first and only one of its session (a gateless
    # client's, its host then lost): no pair of grants to compare, and still no new fence.
    (lambda h: [*h, Event(11, "grant", "t", fence=0, host="c")], "fence did not strictly increase"),
    (lambda h: [*h, Event(11, "flock-failed", "s", fence=2, host="b")],
     "two trees held the session lock at once"),
    (lambda h: [*h, Event(11, "put-stale-ack", "s", fence=1, key="s/1/2")],
     "a stale-fence write was accepted"),
    (lambda h: [*h, Event(11, "indeterminate-grant", "s", fence=3)], "an indeterminate probe led to a grant"),
    (lambda h: [e for e in h if e.key != "s/2/1" or e.kind != "final-key"], "an acknowledged write was lost"),
])
def test_each_violation_is_caught_with_its_slice(broken, rule: str) -> None:
    violations = check(broken(_clean()))
    assert [v.rule for v in violations] == [rule]
    assert violations[0].events, "a violation must show the events that prove it"
    assert rule in str(violations[0])


def test_sessions_are_judged_independently() -> None:
    other = [Event(100 + e.seq, e.kind, "t", e.fence, e.host, e.key.replace("s/", "t/")) for e in _clean()]
    assert check(_clean() + other) == []
