"""The pure lifecycle rules: archive only on a granting verdict, who a host holds, the restore floor
and claims, orphans, and the drain's handoff request (no successor named)."""

from __future__ import annotations

import pytest

from holdfast.coordinator import lifecycle_rules as rules
from holdfast.coordinator.adjudication import AcquireAsk, Action, Reason, Verdict, adjudicate
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

OWNER = apb.ProcessIdentity(host_id="host-a", pid=42, start_ticks=7, spawn_token="a" * 32)


def rec(**lease: object) -> pb.SessionRecord:
    fields: dict[str, object] = {"fence": 3, "handoff_stage": pb.NONE}
    fields.update(lease)
    return pb.SessionRecord(schema_version=1, session_id="session-1", lease=pb.Lease(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(("verdict", "allowed"), [
    (Verdict(Action.GRANT, Reason.FREE), True),
    (Verdict(Action.GRANT, Reason.OWNER_DEAD), True),
    (Verdict(Action.REFUSE, Reason.HELD), False),
    (Verdict(Action.REFUSE, Reason.OWNERSHIP_UNKNOWN), False),  # indeterminate never archives
    (Verdict(Action.REFUSE, Reason.RESERVED), False),
    (Verdict(Action.PROBE, Reason.OWNERSHIP_UNKNOWN), False),
    (Verdict(Action.TO_MANUAL, Reason.MANUAL_RECOVERY), False),
])
def test_archive_only_on_a_granting_verdict(verdict: Verdict, allowed: bool) -> None:
    assert rules.archive_allowed(verdict) is allowed


def test_claimed_on_names_owner_or_reservation_host_only() -> None:
    assert rules.claimed_on(rec(claim_status=pb.LIVE, owner=OWNER), "host-a")
    assert rules.claimed_on(rec(claim_status=pb.CONFLICTED, owner=OWNER), "host-a")
    assert not rules.claimed_on(rec(claim_status=pb.LIVE, owner=OWNER), "host-b")
    assert rules.claimed_on(rec(claim_status=pb.RESERVED, reserved_host_id="host-b"), "host-b")
    assert not rules.claimed_on(rec(claim_status=pb.RELEASED, owner=OWNER), "host-a")


def test_new_session_floor_accumulates_epochs() -> None:
    # A second restore must clear the fences new ids got after the first one (from its floor up).
    assert rules.new_session_floor(0, 1000) == 1000
    assert rules.new_session_floor(1000, 1000) == 2000


def test_restore_floor_is_above_every_known_fence_by_the_epoch() -> None:
    assert rules.restore_floor(pb.Lease(fence=3), 100) == 104
    assert rules.restore_floor(pb.Lease(fence=3, minimum_next_fence=50), 100) == 150


@pytest.mark.parametrize(("claim", "after"), [
    (pb.RESERVED, pb.RESERVED), (pb.COMMITTED, pb.CONFLICTED), (pb.LIVE, pb.CONFLICTED),
    (pb.RELEASED, pb.RELEASED), (pb.CONFLICTED, pb.CONFLICTED),
    (pb.CLAIM_STATUS_UNSPECIFIED, pb.CLAIM_STATUS_UNSPECIFIED),
])
def test_no_claim_survives_a_restore_live(claim: int, after: int) -> None:
    assert rules.restore_claim(pb.Lease(claim_status=claim)) == after  # type: ignore[arg-type]


def test_hosts_named_are_owner_and_reservation_hosts() -> None:
    records = [rec(claim_status=pb.LIVE, owner=OWNER),
               rec(claim_status=pb.RESERVED, reserved_host_id="host-b"), rec(claim_status=pb.RELEASED)]
    assert rules.hosts_named(records) == {"host-a", "host-b"}


def test_orphans_are_token_roots_of_no_claimed_owner() -> None:
    released = apb.ProcessIdentity(host_id="host-a", pid=9, start_ticks=1, spawn_token="d" * 32)
    known = rules.known_tokens([rec(claim_status=pb.CONFLICTED, owner=OWNER),
                                rec(claim_status=pb.RESERVED, reserved_spawn_token="b" * 32),
                                rec(claim_status=pb.RELEASED, owner=released)])
    assert known == {OWNER.spawn_token}
    roots = [apb.TokenRoot(identity=apb.ProcessIdentity(pid=p, spawn_token=t))
             for p, t in ((1, OWNER.spawn_token), (2, "b" * 32), (3, "c" * 32), (4, ""), (5, "d" * 32))]
    # A restored reservation's carrier ran CMD on a commit etcd lost; a released owner's tree was
    # proven gone: both are stopped, never adopted.
    assert [i.pid for i in rules.orphans(roots, known)] == [2, 3, 5]


def test_a_drain_request_admits_any_successor_once_the_owner_let_go() -> None:
    drained = rec(claim_status=pb.RELEASED, handoff_stage=pb.HANDOFF_REQUESTED, handoff_operation_hash="")
    assert adjudicate(drained, AcquireAsk(None, "op-x"), None, 0).reason is Reason.FREE
    # While the owner still holds it, the drain grants nobody: the owner is adjudicated as ever.
    held = rec(claim_status=pb.LIVE, owner=OWNER, handoff_stage=pb.HANDOFF_REQUESTED)
    assert adjudicate(held, AcquireAsk(None, "op-x"), None, 0).action is Action.PROBE
    # A takeover's request still excludes everyone else.
    taken = rec(claim_status=pb.RELEASED, handoff_stage=pb.HANDOFF_REQUESTED, handoff_operation_hash="op-b")
    assert adjudicate(taken, AcquireAsk(None, "op-x"), None, 0).reason is Reason.OPERATION_CONFLICT


def test_purge_keeps_the_fence_floor_and_is_due_once() -> None:
    archived = rec(fence=9, minimum_next_fence=12, claim_status=pb.RELEASED, owner=OWNER,
                   death_evidence=pb.DeathEvidence(kind="archived", observed_at_unix_ms=1000))
    archived.history_seq = 40
    archived.provider_handle_chain.add(handle="thread-1", minted_at_fence=9)
    assert not rules.purge_due(archived, 1000)  # not older than the cutoff
    assert rules.purge_due(archived, 1001)
    kept = rules.floor_only(archived)
    assert (kept.lease.fence, kept.lease.minimum_next_fence, kept.history_seq) == (9, 12, 40)
    assert not kept.provider_handle_chain and not kept.lease.owner.host_id
    assert not rules.purge_due(kept, 10**12)  # already only its floor
    live = rec(claim_status=pb.LIVE, owner=OWNER)
    assert not rules.purge_due(live, 10**12)  # only archived records are ever purged


def test_unsearched_hosts_are_named_or_expected_and_not_registered() -> None:
    unsearched = rules.unsearched_hosts({"host-a", "host-b"}, ["host-c", "host-a"], ["host-a"])
    assert unsearched == ["host-b", "host-c"]


def _report(host: pb.RestoreEpochHost, outcome: str = "released") -> pb.RestoreEpochResponse:
    return pb.RestoreEpochResponse(sessions=[pb.RestoreEpochSession(session_id="s", outcome=outcome)],
                                   hosts=[host])


@pytest.mark.parametrize(("report", "reopen"), [
    (_report(pb.RestoreEpochHost(host_id="a", complete=True)), True),
    (_report(pb.RestoreEpochHost(host_id="a", complete=True), outcome="conflicted"), True),
    (_report(pb.RestoreEpochHost(host_id="a", complete=True), outcome="unchanged"), False),
    (_report(pb.RestoreEpochHost(host_id="a", complete=False)), False),
    (_report(pb.RestoreEpochHost(host_id="a", error="not registered")), False),
    (_report(pb.RestoreEpochHost(host_id="a", complete=True, orphans_not_stopped=["pid 7"])), False),
])
def test_grants_reopen_only_when_every_host_was_searched_and_every_floor_raised(
        report: pb.RestoreEpochResponse, reopen: bool) -> None:
    assert rules.grants_may_reopen(report) is reopen


def test_an_orphan_is_stopped_only_when_its_whole_tree_is_proven_gone() -> None:
    dead_root = {"outcome": apb.PID_ABSENT, "tree_checked": True}
    assert rules.orphan_stopped(apb.ProbeResult(**dead_root, tree_gone=True))
    # KillOwner's deadline passed with descendants alive: the root alone is no proof.
    assert not rules.orphan_stopped(apb.ProbeResult(**dead_root, tree_gone=False))
    assert not rules.orphan_stopped(apb.ProbeResult(outcome=apb.PID_ABSENT))
    matched = apb.ProbeResult(outcome=apb.IDENTITY_MATCHED, tree_checked=True, tree_gone=True)
    assert not rules.orphan_stopped(matched)


def test_release_on_evidence_moves_the_floor_past_the_fence() -> None:
    lease = pb.Lease(fence=4, minimum_next_fence=2, claim_status=pb.LIVE, handoff_stage=pb.FORCE_PENDING)
    rules.release_on_evidence(lease, "host-fenced", "x" * 2000, 123)
    assert (lease.claim_status, lease.handoff_stage, lease.minimum_next_fence) == (pb.RELEASED, pb.NONE, 5)
    assert lease.death_evidence.kind == "host-fenced" and len(lease.death_evidence.detail) == 1024
    assert (lease.death_evidence.observed_at_unix_ms, lease.death_evidence.owner_fence) == (123, 4)


def test_a_host_counts_as_off_on_evidence_written_after_the_gate_with_no_registration_since() -> None:
    assert rules.off_since_restore(gate_put=100, last_registered=40, evidence=120)
    assert rules.off_since_restore(gate_put=100, last_registered=0, evidence=101)  # never registered
    assert not rules.off_since_restore(100, 40, 90)   # evidence from before the restore
    assert not rules.off_since_restore(100, 40, 100)  # the gate's own revision is not after it
    assert not rules.off_since_restore(100, 130, 120)  # registered again after the evidence
    assert not rules.off_since_restore(0, 0, 120)      # no gate: no restore to count it for
    # A snapshot taken while an earlier restore was pending: its gate created at 100, evidence at 120,
    # both restored; the operator's put after the restore is at 300, above all the snapshot holds.
    assert not rules.off_since_restore(gate_put=300, last_registered=40, evidence=120)
