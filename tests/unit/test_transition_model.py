"""Model-based test of the pure transition rules (adjudication, force, release, fences) against a
reference model of the world: which trees really run CMD, what a truthful agent may answer.

Invariants checked after every step: at most one live writer; fences never reused nor decreasing;
a refusal writes nothing (the rules never mutate the record they judge, and a refused step leaves
record and world as they were); an indeterminate answer never grants; a force not allowed kills
nothing.
"""

from __future__ import annotations

import hashlib

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from holdfast.coordinator import adjudication, fencing
from holdfast.coordinator.adjudication import AcquireAsk, Action
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

HOSTS = ("a", "b")
WINDOW_MS = 30_000
OPS = tuple(hashlib.sha256(f"handoff\0op{i}".encode()).hexdigest() for i in range(3))
# A tree's state in the world, and what a truthful agent may answer for it: while any process of
# the tree runs, never a proof that the tree is gone.
RUNNING, ROOT_GONE, GONE = "running", "root-gone", "gone"   # ROOT_GONE: descendants still write
ANSWERS = {
    RUNNING: ("matched", "indeterminate", "unanswered", "contradiction"),
    ROOT_GONE: ("root-dead-tree-unproven", "indeterminate", "unanswered"),
    GONE: ("pid-absent", "root-dead-tree-unproven", "indeterminate", "unanswered"),
}
ALL_ANSWERS = tuple(sorted({a for answers in ANSWERS.values() for a in answers}))


def probe_for(owner: apb.ProcessIdentity, answer: str, now: int) -> apb.ProbeResult:
    by = "" if answer == "unanswered" else owner.host_id
    if answer == "matched":
        return apb.ProbeResult(outcome=apb.IDENTITY_MATCHED, matched_on=["start-time"],
                               answered_by_host_id=by, observed_at_unix_ms=now)
    if answer == "pid-absent":
        return apb.ProbeResult(outcome=apb.PID_ABSENT, answered_by_host_id=by, tree_checked=True,
                               tree_gone=True, observed_at_unix_ms=now)
    if answer == "root-dead-tree-unproven":
        return apb.ProbeResult(outcome=apb.PID_ABSENT, answered_by_host_id=by, tree_checked=True,
                               tree_gone=False, observed_at_unix_ms=now)
    if answer == "contradiction":
        return apb.ProbeResult(outcome=apb.INDETERMINATE, answered_by_host_id=by, contradiction=True,
                               reason="token matched, identity contradicts", observed_at_unix_ms=now)
    return apb.ProbeResult(outcome=apb.INDETERMINATE, answered_by_host_id=by, reason="no proof",
                           observed_at_unix_ms=now)


class Transitions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.record: pb.SessionRecord | None = None
        self.now = 1_000_000
        self.trees: dict[int, str] = {}       # fence → its tree's state (the world)
        self.gates: set[int] = set()          # fences whose gate waits for a commit (never runs CMD)
        self.granted: list[int] = []          # every fence ever granted, in order

    # --- helpers ------------------------------------------------------------------------------
    def lease(self) -> pb.Lease:
        return self.record.lease if self.record is not None else pb.Lease()

    def owner_answer(self, answer: str) -> str:
        """The drawn answer if a truthful agent could give it for the owner's tree, else the first."""
        allowed = ANSWERS[self.trees.get(self.lease().fence, GONE)]
        return answer if answer in allowed else allowed[0]

    def may_force(self, op: str, operator: bool) -> bool:
        """The reference: only the operation whose handoff request the record holds, or an operator."""
        lease = self.lease()
        asked = lease.handoff_stage in (pb.HANDOFF_REQUESTED, pb.FORCE_PENDING)
        return operator or (asked and lease.handoff_operation_hash == op)

    def judge(self, ask: AcquireAsk, probe: apb.ProbeResult | None) -> adjudication.Verdict:
        before = None if self.record is None else self.record.SerializeToString()
        verdict = adjudication.adjudicate(self.record, ask, probe, self.now)
        after = None if self.record is None else self.record.SerializeToString()
        assert before == after, "a rule wrote to the record it judged"
        if probe is not None and probe.outcome == apb.INDETERMINATE:
            assert verdict.action is not Action.GRANT, "indeterminate granted"
        return verdict

    def grant(self, host: str, verdict: adjudication.Verdict) -> None:
        record = self.record or pb.SessionRecord(session_id="sess-model",
                                                 lease=pb.Lease(handoff_stage=pb.NONE))
        old = record.lease
        lease = pb.Lease(fence=fencing.next_fence(old.fence, old.minimum_next_fence),
                         minimum_next_fence=old.minimum_next_fence, claim_status=pb.RESERVED,
                         handoff_stage=pb.NONE, reserved_host_id=host,
                         commit_deadline_unix_ms=self.now + WINDOW_MS)
        if verdict.evidence is not None:
            lease.death_evidence.CopyFrom(verdict.evidence)
        record.lease.CopyFrom(lease)
        self.record = record
        self.granted.append(lease.fence)
        self.gates.add(lease.fence)

    # --- rules --------------------------------------------------------------------------------
    @rule(host=st.sampled_from(HOSTS), op=st.sampled_from(OPS), force=st.booleans(),
          operator=st.booleans(), answer=st.sampled_from(ALL_ANSWERS),
          kill_works=st.booleans())
    def acquire(self, host: str, op: str, force: bool, operator: bool, answer: str, kill_works: bool) -> None:
        ask = AcquireAsk(None, op)
        before = (None if self.record is None else self.record.SerializeToString(), dict(self.trees))
        verdict = self.judge(ask, None)
        if verdict.action is Action.PROBE:
            owner = self.lease().owner
            if force:
                allowed = adjudication.force_allowed(self.lease(), ask, operator)
                assert allowed == self.may_force(op, operator)
                if not allowed:
                    after = (self.record.SerializeToString() if self.record else None, dict(self.trees))
                    assert after == before  # a refused force writes and kills nothing
                    return
                self.lease().handoff_stage = pb.FORCE_PENDING  # the authorising transition
                self.lease().handoff_operation_hash = op
                if kill_works:
                    self.trees[self.lease().fence] = GONE
            verdict = self.judge(ask, probe_for(owner, self.owner_answer(answer), self.now))
        if verdict.action is Action.TO_MANUAL:
            self.lease().handoff_stage = pb.MANUAL_RECOVERY
        elif verdict.action is Action.GRANT:
            self.grant(host, verdict)
        elif not force:
            after = (self.record.SerializeToString() if self.record else None, dict(self.trees))
            assert after == before  # a refusal writes nothing

    @precondition(lambda self: self.lease().claim_status == pb.RESERVED)
    @rule()
    def commit(self) -> None:
        """The reserver's gate commits (a compare on its fence) and starts CMD."""
        fence = self.lease().fence
        if fence not in self.gates:
            return
        self.gates.discard(fence)
        self.lease().claim_status = pb.LIVE
        self.lease().owner.CopyFrom(apb.ProcessIdentity(host_id=self.lease().reserved_host_id, pid=fence))
        self.trees[fence] = RUNNING

    @rule()
    def stale_gate_tries_to_commit(self) -> None:
        """A superseded reservation's gate: its commit compares its fence and fails; it never runs CMD."""
        for fence in list(self.gates):
            if fence != self.lease().fence:
                self.gates.discard(fence)

    @precondition(lambda self: any(state != GONE for state in self.trees.values()))
    @rule(whole_tree=st.booleans())
    def owner_exits(self, whole_tree: bool) -> None:
        """The root exits; its descendants may go on writing (ROOT_GONE) until they end too."""
        for fence, state in self.trees.items():
            if state != GONE:
                self.trees[fence] = GONE if whole_tree or state == ROOT_GONE else ROOT_GONE

    @rule(ms=st.integers(min_value=0, max_value=2 * WINDOW_MS))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: self.record is not None)
    @rule(op=st.sampled_from(OPS))
    def request_handoff(self, op: str) -> None:
        lease = self.lease()
        if lease.handoff_stage == pb.MANUAL_RECOVERY or lease.claim_status == pb.CONFLICTED:
            return
        conflict = lease.handoff_operation_hash not in ("", op)
        if lease.handoff_stage in adjudication.HANDOFF_STAGES and conflict:
            return  # OPERATION_CONFLICT: nothing written
        lease.handoff_stage = pb.HANDOFF_REQUESTED
        lease.handoff_operation_hash = op

    @precondition(lambda self: self.lease().claim_status == pb.LIVE)
    @rule(answer=st.sampled_from(ALL_ANSWERS))
    def release(self, answer: str) -> None:
        lease = self.lease()
        if adjudication.release_allowed(lease, probe_for(lease.owner, self.owner_answer(answer), self.now)):
            assert self.trees.get(lease.fence, GONE) == GONE, "released a tree still writing"
            lease.claim_status = pb.RELEASED

    @precondition(lambda self: self.record is not None and all(s == GONE for s in self.trees.values()))
    @rule()
    def operator_recovers(self) -> None:
        """Recover on a truthful operator's word (the tree is gone): the floor moves past the fence."""
        lease = self.lease()
        lease.minimum_next_fence = fencing.next_fence(lease.fence, lease.minimum_next_fence)
        lease.claim_status = pb.RELEASED
        lease.handoff_stage = pb.NONE

    # --- invariants ---------------------------------------------------------------------------
    @invariant()
    def at_most_one_live_writer(self) -> None:
        live = [fence for fence, state in self.trees.items() if state != GONE]
        assert len(live) <= 1, f"two live writers: fences {live}"

    @invariant()
    def fences_never_reused_nor_decreasing(self) -> None:
        assert self.granted == sorted(set(self.granted))
        if self.granted:
            assert self.lease().fence == self.granted[-1]


Transitions.TestCase.settings = settings(max_examples=300, stateful_step_count=20, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestTransitions = Transitions.TestCase
