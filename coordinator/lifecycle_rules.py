"""Pure rules of a session's lifecycle: archive, drain, bulk recovery and the restore epoch.

Guarantee: no I/O and no clock reads. Archiving is allowed only on a verdict that would grant
(the session has no live owner or reservation, proven); a restore epoch puts every fence below a
floor raised by the epoch and leaves no owner live; an orphan is a token root of no claimed owner;
grants reopen after a restore only when every host that may run owners was searched completely.
"""

from __future__ import annotations

from collections.abc import Iterable

from holdfast.coordinator import adjudication, fencing
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

DEFAULT_EPOCH = 1 << 20
OWNED = (pb.COMMITTED, pb.LIVE)


def archive_allowed(verdict: adjudication.Verdict) -> bool:
    """Only what Acquire itself would grant: free, a superseded reservation, an owner proven dead."""
    return verdict.action is adjudication.Action.GRANT


def purge_due(archived: pb.SessionRecord, cutoff_ms: int) -> bool:
    """Archived before the cutoff and still carrying more than its fence floor."""
    evidence = archived.lease.death_evidence
    return evidence.kind == "archived" and evidence.observed_at_unix_ms < cutoff_ms and (
        archived != floor_only(archived))


def floor_only(archived: pb.SessionRecord) -> pb.SessionRecord:
    """What an archive keeps forever: enough that a revived id starts above every fence it had,
    and belongs to the tenant it belonged to."""
    kept = pb.SessionRecord(schema_version=archived.schema_version, session_id=archived.session_id,
                            history_seq=archived.history_seq, tenant=archived.tenant)
    kept.lease.fence = archived.lease.fence
    kept.lease.minimum_next_fence = archived.lease.minimum_next_fence
    kept.lease.death_evidence.CopyFrom(archived.lease.death_evidence)
    return kept


def claimed_on(record: pb.SessionRecord, host_id: str) -> bool:
    """The host holds this session: its committed owner or its reservation."""
    lease = record.lease
    if lease.claim_status in OWNED or lease.claim_status == pb.CONFLICTED:
        return lease.owner.host_id == host_id
    return lease.claim_status == pb.RESERVED and lease.reserved_host_id == host_id


def release_on_evidence(lease: pb.Lease, kind: str, detail: str, at_unix_ms: int) -> None:
    """The fence is invalidated at once: the floor moves past it and the claim is released, so the
    old grant's writes fail their compare and the next Acquire grants above it."""
    lease.minimum_next_fence = fencing.next_fence(lease.fence, lease.minimum_next_fence)
    lease.claim_status = pb.RELEASED
    lease.handoff_stage = pb.NONE
    lease.death_evidence.CopyFrom(pb.DeathEvidence(kind=kind, detail=detail[:1024],
                                                   observed_at_unix_ms=at_unix_ms, owner_fence=lease.fence))


def restore_floor(lease: pb.Lease, epoch: int) -> int:
    """Above every fence this record knows of by the epoch: grants made after the backup are below it."""
    return fencing.next_fence(lease.fence, lease.minimum_next_fence) + epoch


def new_session_floor(previous: int, epoch: int) -> int:
    """The first fence of an id with no record after a restore: above every fence any session the
    snapshot lacked could have reached (fewer than `epoch` grants since the snapshot)."""
    return previous + epoch


def restore_claim(lease: pb.Lease) -> int:
    """No claim survives a restore live: a committed owner is conflicted until its own host's agent
    proves it gone. A reservation stays one, never released here: it may have committed after the
    snapshot and be running CMD unrecorded, so only adjudication supersedes it, on its host's proof
    that nothing carries its token."""
    if lease.claim_status in OWNED:
        return pb.CONFLICTED
    return lease.claim_status


def unsearched_hosts(named: set[str], expected: Iterable[str], registered: Iterable[str]) -> list[str]:
    """Hosts that may run owners but could not be asked for their token roots."""
    return sorted((named | set(expected)) - set(registered))


def off_since_restore(gate_put: int, last_registered: int, evidence: int) -> bool:
    """An unregistered host counts as searched for the restore under way when evidence that it is off
    — a fence's proof (`fenced/<host>`) or an all-tenants operator's word (`restore-host-off/<host>`,
    written by recover-host) — was written after the restore gate was last put (evidence of an
    earlier moment says nothing of what ran there since the snapshot) and it has not registered since
    (a later incarnation is one the evidence does not cover). `gate_put` is the gate's mod revision:
    a restored etcd keeps the snapshot's revisions and gives every later put a higher one, so only the
    operator's put after the restore is past all the snapshot holds. Its create revision is not: a
    snapshot taken while an earlier restore was pending holds that restore's gate and the evidence
    written after it, and a put over that gate keeps its create revision, so the old evidence counted
    for the new restore. Revisions of this etcd, each compared only with another: 0 for a key that is
    absent, and with no gate nothing counts."""
    return 0 < gate_put < evidence and last_registered < evidence


def unsearched_hint(host_id: str) -> str:
    """What restore-epoch says of a host it could not search, naming the commands that count it."""
    return (f"not registered: its orphans were not searched. Run restore-epoch again once its agent is "
            f"back, or once the node is off: after `holdfast admin fence {host_id} --reason TEXT` proves "
            f"it off, or, for a node gone for good, after `holdfast admin recover-host {host_id} --reason "
            "TEXT` (an all-tenants operator's word, recorded as evidence)")


def grants_may_reopen(response: pb.RestoreEpochResponse) -> bool:
    """After a restore, grants wait until every host that may run owners was searched completely
    with every orphan stopped, and every record's floor was raised: a writer granted after the
    snapshot on a session the snapshot shows free is found only by that search. A conflicted
    session does not hold the others back; it stays refused on its own."""
    hosts_done = all(h.complete and not h.error and not h.orphans_not_stopped for h in response.hosts)
    return hosts_done and all(s.outcome != "unchanged" for s in response.sessions)


def known_tokens(records: Iterable[pb.SessionRecord]) -> set[str]:
    """Tokens of the owners the records still claim. A reservation's token is not among them: a
    carrier of it started CMD after the snapshot (the gate runs CMD only after a commit the restored
    etcd lost), an owner no record knows."""
    return {r.lease.owner.spawn_token for r in records
            if r.lease.claim_status in (*OWNED, pb.CONFLICTED) and r.lease.owner.spawn_token}


def hosts_named(records: Iterable[pb.SessionRecord]) -> set[str]:
    """Every host a record names as owner or reservation: where orphans of a restore may run."""
    return {h for r in records for h in (r.lease.owner.host_id, r.lease.reserved_host_id) if h}


def orphans(roots: Iterable[apb.TokenRoot], known: set[str]) -> list[apb.ProcessIdentity]:
    """Token roots of no claimed owner: stopped, never adopted (the seeds' rule)."""
    return [r.identity for r in roots if r.identity.spawn_token and r.identity.spawn_token not in known]


def orphan_stopped(result: apb.ProbeResult) -> bool:
    """An orphan counts as stopped only when its root is proven dead *and* its tree proven gone: a
    KillOwner that returned at its deadline with descendants alive stopped nothing for sure."""
    return adjudication.proves_gone(result)
