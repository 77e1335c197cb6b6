"""What the public library (holdfast.client) answers with: plain frozen dataclasses, read off the
coordinator's protobuf messages once, at the edge.

Guarantee: no protobuf message reaches a caller of the public API; a status or stage this client does
not know (a newer coordinator's) reads as its number, never as a guess at a known one.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.v1 import coordinator_pb2 as pb

OWNED_STATUSES = ("committed", "live")
# The handoff stages by their name in the record, as the public API spells them ("" for none).
HANDOFF = {pb.HANDOFF_STAGE_UNSPECIFIED: "", pb.NONE: "", pb.HANDOFF_REQUESTED: "requested",
           pb.MANUAL_RECOVERY: "manual-recovery", pb.FORCE_PENDING: "force-pending"}


@dataclass(frozen=True)
class ProviderHandle:
    """One link of a session's provider handle chain: what the provider (an agent CLI) resumes from,
    and the fence of the owner that recorded it."""

    handle: str
    minted_at_fence: int


@dataclass(frozen=True)
class Holder:
    """The process a session's grant was committed to: CMD's gate, on `host_id`, as `pid` in that
    host's PID namespace."""

    host_id: str
    pid: int


@dataclass(frozen=True)
class Record:
    """A session's record as the coordinator holds it. `status` is "reserved", "committed", "live",
    "conflicted" or "released" ("" for a session never granted); `handoff` is "", "requested",
    "manual-recovery" or "force-pending"; `holder` is None while no process is committed."""

    session_id: str
    fence: int
    status: str
    handoff: str
    holder: Holder | None
    provider: str
    provider_handles: tuple[ProviderHandle, ...]
    tenant: str

    @property
    def held(self) -> bool:
        """Whether a committed owner has the session (a plain run would be refused HELD)."""
        return self.status in OWNED_STATUSES

    @property
    def resume_handle(self) -> str:
        """The newest provider handle, the one the next owner resumes ("" when there is none)."""
        return self.provider_handles[-1].handle if self.provider_handles else ""


@dataclass(frozen=True)
class FencedValue:
    """A fenced key as read: `value` is None when the key was never written; `revision` is the etcd
    revision of its last write (0 when absent)."""

    session_id: str
    key: str
    value: bytes | None
    revision: int


def record_of(record: pb.SessionRecord) -> Record:
    lease = record.lease
    known = lease.claim_status in pb.ClaimStatus.values()
    status = pb.ClaimStatus.Name(lease.claim_status).lower() if known else str(lease.claim_status)
    committed = lease.claim_status in (pb.COMMITTED, pb.LIVE) and lease.owner.pid
    return Record(
        session_id=record.session_id, fence=lease.fence,
        status="" if lease.claim_status == pb.CLAIM_STATUS_UNSPECIFIED else status,
        handoff=HANDOFF.get(lease.handoff_stage, str(lease.handoff_stage)),
        holder=Holder(lease.owner.host_id, lease.owner.pid) if committed else None,
        provider=record.provider,
        provider_handles=tuple(ProviderHandle(link.handle, link.minted_at_fence)
                               for link in record.provider_handle_chain),
        tenant=record.tenant)


def value_of(session_id: str, key: str, response: pb.FencedGetResponse) -> FencedValue:
    return FencedValue(session_id, key, response.value if response.found else None,
                       response.revision if response.found else 0)
