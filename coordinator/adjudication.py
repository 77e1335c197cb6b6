"""The adjudication rules of docs/design.md §3 as pure functions: no I/O, no clock reads.

Guarantee: a grant is returned only for a free session, a reservation that is past its commit
deadline or proven unused, or an owner whose root is proven dead *and* whose tree is proven gone
by its own host's agent. Anything else is a refusal, and a refusal carries no write. Time alone
never grants: the deadline only lets an uncommitted reservation (which can never run CMD) go.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from holdfast.common.names import outcome_name
from holdfast.common.reasons import Reason
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

PROVEN_DEAD = {apb.EXIT_OBSERVED, apb.PID_ABSENT, apb.IDENTITY_MISMATCH}
ROOT_ENDED = PROVEN_DEAD | {apb.RESERVATION_UNUSED}  # a release's root: dead, or never started
# A handoff in progress: asked of the owner (handoff-requested), or its kill authorised (force-pending).
HANDOFF_STAGES = (pb.HANDOFF_REQUESTED, pb.FORCE_PENDING)


class Action(StrEnum):
    GRANT = "grant"
    REFUSE = "refuse"
    PROBE = "probe"            # the rules need the owner host's answer before deciding
    TO_MANUAL = "to-manual"    # contradictory evidence: the one refusal that writes (manual-recovery)


@dataclass(frozen=True)
class AcquireAsk:
    expected_fence: int | None   # None = no expectation
    operation_hash: str          # hash of (rpc, caller, operation id), never the id itself


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: Reason
    detail: str = ""
    evidence: pb.DeathEvidence | None = None


def has_claim(lease: pb.Lease) -> bool:
    return lease.claim_status in (pb.RESERVED, pb.COMMITTED, pb.LIVE, pb.CONFLICTED)


def adjudicate(
    record: pb.SessionRecord | None, ask: AcquireAsk, probe: apb.ProbeResult | None, now_ms: int
) -> Verdict:
    """Decide an Acquire in the order of docs/design.md §3."""
    lease = record.lease if record is not None else pb.Lease()
    if ask.expected_fence is not None and ask.expected_fence != lease.fence:
        return Verdict(Action.REFUSE, Reason.STALE_FENCE, f"expected fence {ask.expected_fence}, "
                       f"current {lease.fence}")
    if lease.claim_status == pb.CONFLICTED or lease.handoff_stage == pb.MANUAL_RECOVERY:
        return Verdict(Action.REFUSE, Reason.MANUAL_RECOVERY, "session is in manual recovery; use Recover")
    if requested_by_another(lease, ask.operation_hash):
        return Verdict(Action.REFUSE, Reason.OPERATION_CONFLICT,
                       f"a handoff was requested by host {lease.handoff_requested_by_host}")
    if not has_claim(lease):
        return Verdict(Action.GRANT, Reason.FREE)
    if lease.claim_status == pb.RESERVED:
        return _reservation(lease, probe, now_ms)
    return _owner(lease, probe)


def _reservation(lease: pb.Lease, probe: apb.ProbeResult | None, now_ms: int) -> Verdict:
    if now_ms >= lease.commit_deadline_unix_ms:
        # Safe by the spawn gate: an uncommitted reservation can never run CMD.
        return Verdict(Action.GRANT, Reason.RESERVATION_SUPERSEDED, "commit deadline passed",
                       _evidence("reservation-superseded", "commit deadline passed", now_ms, lease.fence))
    if probe is not None and probe.outcome == apb.RESERVATION_UNUSED:
        return Verdict(Action.GRANT, Reason.RESERVATION_SUPERSEDED, "no carrier of the reserved token",
                       _evidence("reservation-unused", probe.reason, probe.observed_at_unix_ms, lease.fence))
    return Verdict(Action.REFUSE, Reason.RESERVED,
                   f"reserved for host {lease.reserved_host_id} until {lease.commit_deadline_unix_ms}")


def _owner(lease: pb.Lease, probe: apb.ProbeResult | None) -> Verdict:
    owner = lease.owner
    if probe is None:
        return Verdict(Action.PROBE, Reason.OWNERSHIP_UNKNOWN, "owner not probed yet")
    if not probe.answered_by_host_id:
        # No agent answered (unregistered, unreachable, timed out): the router's reason says which.
        return Verdict(Action.REFUSE, Reason.OWNERSHIP_UNKNOWN, f"no answer from host {owner.host_id!r}: "
                       f"{probe.reason or 'no reason given'}")
    if probe.answered_by_host_id != owner.host_id:
        return Verdict(Action.REFUSE, Reason.OWNERSHIP_UNKNOWN,
                       f"probe answered by {probe.answered_by_host_id!r}, "
                       f"not the owner host {owner.host_id!r}")
    if probe.contradiction:
        return Verdict(Action.TO_MANUAL, Reason.MANUAL_RECOVERY, f"contradictory evidence: {probe.reason}")
    name = outcome_name(probe.outcome)
    if probe.outcome in PROVEN_DEAD:
        if tree_state(probe) == apb.TREE_ALIVE:
            # A member seen alive holds the session as a live root would: refused as unknown, the
            # next step offered was `holdfast recover`, a second writer beside the tree still running.
            return Verdict(Action.REFUSE, *_tree_alive(name, probe))
        if tree_state(probe) != apb.TREE_GONE:
            why = probe.tree_reason or "tree not proven gone"
            return Verdict(Action.REFUSE, Reason.OWNERSHIP_UNKNOWN, f"root {name} but {why}")
        detail = probe.mismatch_field or probe.reason
        return Verdict(Action.GRANT, Reason.OWNER_DEAD, f"{name} {detail}".strip(),
                       _evidence(name, detail, probe.observed_at_unix_ms, lease.fence))
    if probe.outcome == apb.IDENTITY_MATCHED and probe.matched_on:
        return Verdict(Action.REFUSE, Reason.HELD,
                       f"held by pid {owner.pid} on host {owner.host_id} "
                       f"since {_utc(lease.owner_since_unix_ms)} (matched on {','.join(probe.matched_on)})")
    return Verdict(Action.REFUSE, Reason.OWNERSHIP_UNKNOWN, probe.reason or f"{name} proves nothing")


def _utc(unix_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_ms / 1000))


def force_allowed(lease: pb.Lease, ask: AcquireAsk, operator: bool) -> bool:
    """`force` is honoured only for the caller whose handoff request the record holds (the same
    operation that asked), or an operator certificate (docs/design.md §5). A drain's request names no
    operation, so it lets nobody but an operator force."""
    requested = (lease.handoff_stage in HANDOFF_STAGES and bool(lease.handoff_operation_hash)
                 and lease.handoff_operation_hash == ask.operation_hash)
    return requested or operator


def requested_by_another(lease: pb.Lease, operation_hash: str) -> bool:
    """A handoff is in progress for another operation. A drain's request names no operation (empty
    hash): it asks the owner to let go and reserves nothing, so it conflicts with no one."""
    return (lease.handoff_stage in HANDOFF_STAGES and bool(lease.handoff_operation_hash)
            and lease.handoff_operation_hash != operation_hash)


def answer_drain_request(lease: pb.Lease) -> None:
    """At a release: a drain's handoff request (it names no operation) is answered, and the stage
    goes back to none (a released record showed `handoff-requested` in `status` and the metrics);
    a takeover's stays, keeping the session for its operation (requested_by_another)."""
    if lease.handoff_stage in HANDOFF_STAGES and not lease.handoff_operation_hash:
        lease.handoff_stage = pb.NONE
        lease.handoff_requested_by_host = ""


def ask_owner(lease: pb.Lease, operation_hash: str, host_id: str) -> bool:
    """Marks `lease` handoff-requested by this operation (a drain's request, which names none, is
    taken over); False when this operation's request is already the record's: nothing to write.
    Another operation's request is refused before this is reached (OPERATION_CONFLICT)."""
    if lease.handoff_stage in HANDOFF_STAGES and lease.handoff_operation_hash == operation_hash:
        return False
    lease.handoff_stage = pb.HANDOFF_REQUESTED
    lease.handoff_operation_hash = operation_hash
    lease.handoff_requested_by_host = host_id
    return True


def tree_state(probe: apb.ProbeResult) -> apb.TreeState:
    """What the agent's tree check proved. An agent from before `tree_state` answers with
    tree_checked/tree_gone alone, which do not tell a member seen from absence not shown: its
    "not gone" is UNPROVEN, never ALIVE (nothing is claimed alive that was not seen)."""
    if probe.tree_state != apb.TREE_UNCHECKED:
        return probe.tree_state
    if not probe.tree_checked:
        return apb.TREE_UNCHECKED
    return apb.TREE_GONE if probe.tree_gone else apb.TREE_UNPROVEN


def proves_gone(probe: apb.ProbeResult) -> bool:
    """A result that proves its owner's root dead and its tree gone: what OWNER_DEAD rests on
    (whose host answered is the adjudication's to check against the record)."""
    return (probe.outcome in PROVEN_DEAD and tree_state(probe) == apb.TREE_GONE
            and not probe.contradiction)


def release_allowed(lease: pb.Lease, probe: apb.ProbeResult) -> bool:
    """Release needs the whole tree proven gone by the owner's own host (docs/design.md §2)."""
    return (probe.answered_by_host_id == lease.owner.host_id and tree_state(probe) == apb.TREE_GONE
            and probe.outcome in ROOT_ENDED)


def release_refusal(lease: pb.Lease, probe: apb.ProbeResult) -> tuple[Reason, str]:
    """Why a Release `release_allowed` refused is refused: TREE_ALIVE only when the owner's host saw
    it alive (its root matched, or a member of its tree); OWNERSHIP_UNKNOWN when nobody could say
    (no answer from that host, a root or tree whose absence is unproven). A busy host's scan that
    did not settle is not a live tree: told apart, the owner asks again instead of giving up on a
    session its own check found ended."""
    owner = lease.owner
    if probe.answered_by_host_id != owner.host_id:
        # Nobody looked (an agent re-registering, unreachable): not "alive", unknown.
        return Reason.OWNERSHIP_UNKNOWN, (f"the owner host's agent did not answer: "
                                          f"{probe.reason or 'no reason given'}; nothing was released")
    name = outcome_name(probe.outcome)
    if probe.outcome == apb.IDENTITY_MATCHED and probe.matched_on and not probe.contradiction:
        return Reason.TREE_ALIVE, (f"the owner's root, pid {owner.pid} on host {owner.host_id}, is alive "
                                   f"(matched on {','.join(probe.matched_on)})")
    if probe.outcome not in ROOT_ENDED:
        return Reason.OWNERSHIP_UNKNOWN, (f"the owner's root is not proven dead ({name}): "
                                          f"{probe.reason or 'no reason given'}; nothing was released")
    if tree_state(probe) == apb.TREE_ALIVE:
        return _tree_alive(name, probe)
    return Reason.OWNERSHIP_UNKNOWN, (f"root {name} but its tree is not proven gone: "
                                      f"{probe.tree_reason or 'not checked'}; nothing was released")


def replay_still_valid(stored_fence: int, record: pb.SessionRecord | None) -> bool:
    """A replayed grant stands only while the record is still at that grant's fence."""
    return record is not None and record.lease.fence == stored_fence and record.lease.claim_status in (
        pb.RESERVED, pb.COMMITTED, pb.LIVE)


def replay_released(stored_fence: int, record: pb.SessionRecord | None) -> bool:
    """The operation's grant was released at its own fence: it is over, and the operation is decided
    afresh (a `run` that replayed an earlier run's grant, committed to that run's gate, releases it
    once the gate is proven gone and asks again). Only the grant's holder can release it, so no lost
    answer is granted twice: the first grant has no owner left."""
    return (record is not None and record.lease.fence == stored_fence
            and record.lease.claim_status == pb.RELEASED)


def _evidence(kind: str, detail: str, observed_at_ms: int, owner_fence: int) -> pb.DeathEvidence:
    return pb.DeathEvidence(
        kind=kind, detail=detail, observed_at_unix_ms=observed_at_ms, owner_fence=owner_fence
    )


def _tree_alive(root: str, probe: apb.ProbeResult) -> tuple[Reason, str]:
    """A root proven dead whose host saw a member of its tree alive."""
    return Reason.TREE_ALIVE, f"root {root} but {probe.tree_reason or 'its tree is alive'}"
