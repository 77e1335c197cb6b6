"""Table-driven tests of the pure adjudication rules (docs/design.md §3 order) and of next_fence."""

from __future__ import annotations

import pytest

from holdfast.common import reasons
from holdfast.coordinator.adjudication import (
    AcquireAsk,
    Action,
    Reason,
    adjudicate,
    answer_drain_request,
    ask_owner,
    proves_gone,
    release_allowed,
    release_refusal,
    replay_released,
    replay_still_valid,
    tree_state,
)
from holdfast.coordinator.fencing import next_fence
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

NOW = 1_000_000
OWNER = apb.ProcessIdentity(host_id="host-a", pid=42, start_ticks=7, spawn_token="a" * 32)


def record(**lease: object) -> pb.SessionRecord:
    base: dict[str, object] = {"fence": 3, "handoff_stage": pb.NONE}
    base.update(lease)
    return pb.SessionRecord(schema_version=1, session_id="session-1", lease=pb.Lease(**base))


def owned(**lease: object) -> pb.SessionRecord:
    return record(claim_status=pb.LIVE, owner=OWNER, **lease)


def probe(outcome: int, *, host: str = "host-a", tree: bool | None = True, **kw: object) -> apb.ProbeResult:
    return apb.ProbeResult(outcome=outcome, answered_by_host_id=host, tree_checked=tree is not None,
                           tree_gone=bool(tree), observed_at_unix_ms=NOW, **kw)


ASK = AcquireAsk(expected_fence=None, operation_hash="op-b")

CASES = [
    ("new session", None, ASK, None, Action.GRANT, Reason.FREE),
    ("released session", record(claim_status=pb.RELEASED), ASK, None, Action.GRANT, Reason.FREE),
    ("stale expected fence", owned(), AcquireAsk(2, "op-b"), None, Action.REFUSE, Reason.STALE_FENCE),
    ("stale expected on a free record", record(claim_status=pb.RELEASED), AcquireAsk(9, "op-b"), None,
     Action.REFUSE, Reason.STALE_FENCE),
    ("stale fence beats a dead owner", owned(), AcquireAsk(1, "op-b"), probe(apb.PID_ABSENT),
     Action.REFUSE, Reason.STALE_FENCE),
    ("conflicted stays refused even with exit-observed", record(claim_status=pb.CONFLICTED, owner=OWNER),
     ASK, probe(apb.EXIT_OBSERVED), Action.REFUSE, Reason.MANUAL_RECOVERY),
    ("manual stage refuses", owned(handoff_stage=pb.MANUAL_RECOVERY), ASK, probe(apb.PID_ABSENT),
     Action.REFUSE, Reason.MANUAL_RECOVERY),
    ("handoff under another op id", owned(handoff_stage=pb.HANDOFF_REQUESTED, handoff_operation_hash="op-x"),
     ASK, probe(apb.PID_ABSENT), Action.REFUSE, Reason.OPERATION_CONFLICT),
    ("handoff under our op id proceeds", owned(handoff_stage=pb.HANDOFF_REQUESTED,
     handoff_operation_hash="op-b"), ASK, probe(apb.PID_ABSENT), Action.GRANT, Reason.OWNER_DEAD),
    ("young reservation is held", record(claim_status=pb.RESERVED, commit_deadline_unix_ms=NOW + 1), ASK,
     None, Action.REFUSE, Reason.RESERVED),
    ("young reservation with a carrier is held", record(claim_status=pb.RESERVED,
     commit_deadline_unix_ms=NOW + 1), ASK, probe(apb.INDETERMINATE), Action.REFUSE, Reason.RESERVED),
    ("young reservation freed only on reservation-unused", record(claim_status=pb.RESERVED,
     commit_deadline_unix_ms=NOW + 1), ASK, probe(apb.RESERVATION_UNUSED), Action.GRANT,
     Reason.RESERVATION_SUPERSEDED),
    ("old reservation superseded", record(claim_status=pb.RESERVED, commit_deadline_unix_ms=NOW), ASK, None,
     Action.GRANT, Reason.RESERVATION_SUPERSEDED),
    ("owner not probed asks for a probe", owned(), ASK, None, Action.PROBE, Reason.OWNERSHIP_UNKNOWN),
    ("exit observed, tree gone", owned(), ASK, probe(apb.EXIT_OBSERVED), Action.GRANT, Reason.OWNER_DEAD),
    ("pid absent, tree gone", owned(), ASK, probe(apb.PID_ABSENT), Action.GRANT, Reason.OWNER_DEAD),
    ("mismatch, tree gone", owned(), ASK, probe(apb.IDENTITY_MISMATCH, mismatch_field="incarnation"),
     Action.GRANT, Reason.OWNER_DEAD),
    ("root dead but tree alive", owned(), ASK, probe(apb.PID_ABSENT, tree=False), Action.REFUSE,
     Reason.OWNERSHIP_UNKNOWN),
    ("root dead, tree unchecked", owned(), ASK, probe(apb.PID_ABSENT, tree=None), Action.REFUSE,
     Reason.OWNERSHIP_UNKNOWN),
    ("alive", owned(), ASK, probe(apb.IDENTITY_MATCHED, matched_on=["start-time", "pidfd"]), Action.REFUSE,
     Reason.HELD),
    ("bare pid match is not life", owned(), ASK, probe(apb.IDENTITY_MATCHED), Action.REFUSE,
     Reason.OWNERSHIP_UNKNOWN),
    ("indeterminate is never death", owned(), ASK, probe(apb.INDETERMINATE, reason="agent unreachable"),
     Action.REFUSE, Reason.OWNERSHIP_UNKNOWN),
    ("another host's answer proves nothing", owned(), ASK, probe(apb.PID_ABSENT, host="host-b"),
     Action.REFUSE, Reason.OWNERSHIP_UNKNOWN),
    ("contradiction moves to manual", owned(), ASK, probe(apb.INDETERMINATE, contradiction=True),
     Action.TO_MANUAL, Reason.MANUAL_RECOVERY),
]


@pytest.mark.parametrize(
    ("name", "rec", "ask", "result", "action", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_adjudication_table(name, rec, ask, result, action, reason) -> None:
    verdict = adjudicate(rec, ask, result, NOW)
    assert (verdict.action, verdict.reason) == (action, reason), verdict.detail
    # A refusal carries no evidence to write; a grant over a previous owner records why.
    if action is Action.REFUSE:
        assert verdict.evidence is None
    if reason in (Reason.OWNER_DEAD, Reason.RESERVATION_SUPERSEDED):
        assert verdict.evidence is not None and verdict.evidence.owner_fence == 3


def test_refusal_does_not_touch_the_record() -> None:
    rec = owned()
    before = rec.SerializeToString()
    adjudicate(rec, ASK, probe(apb.IDENTITY_MATCHED, matched_on=["pidfd"]), NOW)
    assert rec.SerializeToString() == before


@pytest.mark.parametrize(("fence", "floor", "expected"), [(0, 0, 1), (3, 0, 4), (3, 10, 10), (10, 10, 11),
                                                          (3, 4, 4)])
def test_grant_is_exactly_the_next_fence_and_respects_the_floor(fence, floor, expected) -> None:
    assert next_fence(fence, floor) == expected


@pytest.mark.parametrize(("stored", "rec", "valid", "released"), [
    (3, owned(), True, False),
    (3, owned(fence=4), False, False),              # a replayed grant whose fence moved is stale
    (3, record(claim_status=pb.RELEASED), False, True),  # over: the operation is decided afresh
    (3, record(fence=4, claim_status=pb.RELEASED), False, False),
    (3, None, False, False),
])
def test_replayed_grant(stored, rec, valid, released) -> None:
    assert replay_still_valid(stored, rec) is valid
    assert replay_released(stored, rec) is released


@pytest.mark.parametrize(("result", "allowed"), [
    (probe(apb.PID_ABSENT), True),
    (probe(apb.PID_ABSENT, tree=False), False),
    (probe(apb.PID_ABSENT, tree=None), False),
    (probe(apb.IDENTITY_MATCHED, matched_on=["pidfd"]), False),
    (probe(apb.INDETERMINATE), False),
    (probe(apb.PID_ABSENT, host="host-b"), False),
])
def test_release_needs_the_tree_gone(result, allowed) -> None:
    assert release_allowed(owned().lease, result) is allowed


def state(outcome: int, tree: int, why: str = "", **kw: object) -> apb.ProbeResult:
    """An answer of an agent that says its tree state (and its two booleans beside it)."""
    return probe(outcome, tree=None if tree == apb.TREE_UNCHECKED else tree == apb.TREE_GONE,
                 tree_state=tree, tree_reason=why, **kw)


@pytest.mark.parametrize(("result", "expected"), [
    (state(apb.PID_ABSENT, apb.TREE_GONE), apb.TREE_GONE),
    (state(apb.PID_ABSENT, apb.TREE_ALIVE), apb.TREE_ALIVE),
    (state(apb.PID_ABSENT, apb.TREE_UNPROVEN), apb.TREE_UNPROVEN),
    (state(apb.IDENTITY_MATCHED, apb.TREE_UNCHECKED), apb.TREE_UNCHECKED),
    # An agent from before tree_state: gone is gone, and "not gone" is not proof of life.
    (probe(apb.PID_ABSENT, tree=True), apb.TREE_GONE),
    (probe(apb.PID_ABSENT, tree=False), apb.TREE_UNPROVEN),
    (probe(apb.PID_ABSENT, tree=None), apb.TREE_UNCHECKED),
])
def test_the_tree_state_of_new_and_old_agents(result, expected) -> None:
    assert tree_state(result) == expected
    assert release_allowed(owned().lease, result) is (expected == apb.TREE_GONE)
    assert proves_gone(result) is (expected == apb.TREE_GONE)


SETTLE = "the scan did not settle in 64 passes (processes kept exiting before they could be read)"


@pytest.mark.parametrize(("result", "reason", "said"), [
    # Seen alive by the owner's own host: its root, or a member of its tree.
    (probe(apb.IDENTITY_MATCHED, tree=None, matched_on=["pidfd", "start-time"]), Reason.TREE_ALIVE,
     "root, pid 42 on host host-a, is alive (matched on pidfd,start-time)"),
    (state(apb.PID_ABSENT, apb.TREE_ALIVE, "2 process(es) still carry the token"), Reason.TREE_ALIVE,
     "root pid-absent but 2 process(es) still carry the token"),
    (state(apb.EXIT_OBSERVED, apb.TREE_ALIVE, "the session's cgroup is still populated"), Reason.TREE_ALIVE,
     "cgroup is still populated"),
    # Not proven either way: unknown, with the agent's reason, never "alive".
    (state(apb.EXIT_OBSERVED, apb.TREE_UNPROVEN, SETTLE), Reason.OWNERSHIP_UNKNOWN,
     f"root exit-observed but its tree is not proven gone: {SETTLE}; nothing was released"),
    (state(apb.PID_ABSENT, apb.TREE_UNPROVEN, "1 process(es) could not be read; absence is unproven"),
     Reason.OWNERSHIP_UNKNOWN, "1 process(es) could not be read"),
    (probe(apb.PID_ABSENT, tree=False, tree_reason="an old agent's words"), Reason.OWNERSHIP_UNKNOWN,
     "an old agent's words"),
    (probe(apb.PID_ABSENT, tree=None), Reason.OWNERSHIP_UNKNOWN, "not proven gone: not checked"),
    (probe(apb.INDETERMINATE, tree=None, reason="permission denied"), Reason.OWNERSHIP_UNKNOWN,
     "root is not proven dead (indeterminate): permission denied"),
    (probe(apb.INDETERMINATE, tree=None, reason="start ticks differ", contradiction=True),
     Reason.OWNERSHIP_UNKNOWN, "start ticks differ"),
    (probe(apb.PID_ABSENT, host="", reason="agent unreachable"), Reason.OWNERSHIP_UNKNOWN,
     "did not answer: agent unreachable"),
    # Another host's "alive" is no proof for this owner.
    (probe(apb.IDENTITY_MATCHED, host="host-b", matched_on=["pidfd"]), Reason.OWNERSHIP_UNKNOWN,
     "did not answer"),
])
def test_a_refused_release_is_tree_alive_only_on_a_member_seen(result, reason, said) -> None:
    assert not release_allowed(owned().lease, result)
    got, message = release_refusal(owned().lease, result)
    assert got == reason and said in message, message


def test_an_acquire_over_a_dead_root_whose_tree_was_seen_alive_is_tree_alive_and_waits() -> None:
    """Refused as unknown, the CLI offered `holdfast recover` for a tree its host saw running."""
    seen = state(apb.EXIT_OBSERVED, apb.TREE_ALIVE, "the session's cgroup is still populated")
    verdict = adjudicate(owned(), ASK, seen, NOW)
    assert (verdict.action, verdict.reason) == (Action.REFUSE, Reason.TREE_ALIVE)
    assert verdict.detail == "root exit-observed but the session's cgroup is still populated"
    assert verdict.evidence is None
    # A waiting run keeps waiting, `holdfast probe` says held, and the next step ends the tree.
    assert reasons.waitable(verdict.reason) and reasons.verdict(verdict.reason) == "held"
    assert "recover" not in reasons.next_step(verdict.reason, "session-1", 3)
    # Absence merely unproven stays unknown: nothing was seen alive.
    unproven = state(apb.EXIT_OBSERVED, apb.TREE_UNPROVEN, SETTLE)
    assert adjudicate(owned(), ASK, unproven, NOW).reason == Reason.OWNERSHIP_UNKNOWN


def test_held_names_the_owner_and_since_when_in_utc() -> None:
    # 2026-12-03T07:40:24Z: an operator reads the refusal, not a count of milliseconds.
    rec = owned(owner_since_unix_ms=1_796_283_624_037)
    verdict = adjudicate(rec, ASK, probe(apb.IDENTITY_MATCHED, matched_on=["pidfd"]), NOW)
    assert verdict.reason == Reason.HELD
    assert "pid 42 on host host-a since 2026-12-03T07:40:24Z" in verdict.detail


def test_no_answer_is_unknown_and_names_the_router_reason() -> None:
    why = "agent of host-a unreachable: DEADLINE_EXCEEDED"
    unanswered = apb.ProbeResult(outcome=apb.PID_ABSENT, reason=why, tree_checked=True, tree_gone=True,
                                 observed_at_unix_ms=NOW)
    verdict = adjudicate(owned(), ASK, unanswered, NOW)
    # Even a result that claims death is no evidence when no agent answered for the owner's host.
    assert (verdict.action, verdict.reason) == (Action.REFUSE, Reason.OWNERSHIP_UNKNOWN)
    assert verdict.detail == f"no answer from host 'host-a': {why}"


@pytest.mark.parametrize("stage, by, writes", [
    (pb.NONE, "", True),                   # not asked yet
    (pb.HANDOFF_REQUESTED, "", True),      # a drain's request, naming no operation: taken over
    (pb.HANDOFF_REQUESTED, "op-a", False),  # this operation's request already: nothing to write
    (pb.FORCE_PENDING, "op-a", False),     # its force already authorised: never stepped back
])
def test_asking_the_owner_writes_only_what_is_not_the_records_already(stage, by, writes) -> None:
    lease = pb.Lease(fence=3, claim_status=pb.LIVE, handoff_stage=stage, handoff_operation_hash=by)
    before = pb.Lease()
    before.CopyFrom(lease)
    assert ask_owner(lease, "op-a", "host-b") is writes
    if writes:
        assert (lease.handoff_stage, lease.handoff_operation_hash, lease.handoff_requested_by_host) == (
            pb.HANDOFF_REQUESTED, "op-a", "host-b")
    else:
        assert lease == before


@pytest.mark.parametrize("stage, by, after", [
    (pb.HANDOFF_REQUESTED, "", pb.NONE),                   # a drain's: answered by the release
    (pb.HANDOFF_REQUESTED, "op-a", pb.HANDOFF_REQUESTED),  # a takeover's: the session stays its
    (pb.FORCE_PENDING, "op-a", pb.FORCE_PENDING),
    (pb.MANUAL_RECOVERY, "", pb.MANUAL_RECOVERY),
])
def test_a_release_answers_a_drains_request_and_keeps_a_takeovers(stage, by, after) -> None:
    lease = pb.Lease(fence=3, claim_status=pb.RELEASED, handoff_stage=stage, handoff_operation_hash=by,
                     handoff_requested_by_host="drain of host-a" if not by else "host-b")
    answer_drain_request(lease)
    assert lease.handoff_stage == after
    assert (lease.handoff_requested_by_host == "") == (after == pb.NONE)
    # A takeover's request still reserves the released session for its operation.
    assert adjudicate(pb.SessionRecord(lease=lease), AcquireAsk(None, "op-z"), None, 0).action == (
        Action.GRANT if after == pb.NONE else Action.REFUSE)


@pytest.mark.parametrize("outcome, checked, gone, contradiction, proven", [
    (apb.EXIT_OBSERVED, True, True, False, True),
    (apb.PID_ABSENT, True, True, False, True),
    (apb.IDENTITY_MISMATCH, True, True, False, True),
    (apb.EXIT_OBSERVED, True, False, False, False),   # the root is gone, a descendant is not
    (apb.EXIT_OBSERVED, False, False, False, False),  # an older agent: the tree was not read
    (apb.EXIT_OBSERVED, True, True, True, False),     # contradictory evidence proves nothing
    (apb.INDETERMINATE, True, True, False, False),    # e.g. misrouted: no scan here proves it
    (apb.IDENTITY_MATCHED, True, True, False, False),
])
def test_an_exit_events_result_stands_for_a_probe_only_when_it_proves_the_tree_gone(
        outcome, checked, gone, contradiction, proven) -> None:
    result = apb.ProbeResult(outcome=outcome, tree_checked=checked, tree_gone=gone,
                             contradiction=contradiction)
    assert proves_gone(result) is proven
