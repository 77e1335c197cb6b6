"""Who may call which Coordinator RPC, by the role in the caller's verified certificate.

Guarantee (with TLS): only an agent certificate naming host H may RegisterHost or Heartbeat H;
only a client (runtime) or operator certificate may make the runtime's session calls;
only an operator certificate may make the calls that override evidence or touch every session
(docs/design.md §4: a stolen runtime key must not release a live owner); retention (PurgeArchives) needs
maintenance or operator; any certificate of the CA may read (what its tenant may: an agent's or a
maintenance certificate no session, coordinator/tenancy.py); a method not listed here is refused.
A pure rule: the gate in holdfast.common.authorization runs it before the handler, so a refusal
writes nothing. The grant secret is still checked by the service for every owner write: a
certificate says who may ask, never which grant is theirs.
"""

from __future__ import annotations

from holdfast.common.authorization import Refusal, no_role, wrong_role
from holdfast.common.tls import Role
from holdfast.v1 import coordinator_pb2 as pb

READS = frozenset({"GetSession", "ListSessions", "WatchSessions", "ListHosts", "FencedGet", "ProbeSession",
                   "GetArchivedSession", "GetCarry"})
# A runtime's calls. The operator may make them too (e.g. a forced takeover on a runtime's behalf,
# docs/design.md §5); whether `force` is honoured is the service's decision, not this gate's.
SESSION_WRITES = frozenset({"Acquire", "Hold", "CommitOwner", "RecordProviderHandle", "Release",
                            "RequestHandoff", "FencedPut", "BeginCarry", "PutCarryChunk", "CommitCarry"})
# Override evidence (Recover, RecoverHost, RestoreEpoch), power a node off (FenceHost) or act on
# sessions that are not the caller's (ArchiveSession, DrainHost): operator only.
OPERATOR_CALLS = frozenset({"Recover", "RecoverHost", "FenceHost", "RestoreEpoch", "ArchiveSession",
                            "DrainHost"})
RETENTION_CALLS = frozenset({"PurgeArchives"})
HOST_CALLS = frozenset({"RegisterHost", "Heartbeat"})
# A coordinator's certificate dials agents and acts for no tenant: it makes no session call.
WRITER_KINDS = ("client", "operator")
RETENTION_KINDS = ("maintenance", "operator")


def _host_of(method: str, request: object) -> str:
    if isinstance(request, pb.RegisterHostRequest):
        return request.registration.host_id
    if isinstance(request, pb.HeartbeatRequest):
        return request.host_id
    raise TypeError(f"{method} carries no host id")


def coordinator_rule(method: str, role: Role | None, request: object) -> Refusal | None:
    if role is None:
        return no_role(method)
    if method in READS:
        return None
    if method in SESSION_WRITES:
        return None if role.kind in WRITER_KINDS else wrong_role(method, role, "a client certificate")
    if method in OPERATOR_CALLS:
        return None if role.kind == "operator" else wrong_role(method, role, "an operator certificate")
    if method in RETENTION_CALLS:
        return None if role.kind in RETENTION_KINDS else wrong_role(
            method, role, "a maintenance or operator certificate")
    if method in HOST_CALLS:
        host = _host_of(method, request)
        if role.kind == "agent" and role.name == host:
            return None
        # The requested host id is the caller's own claim, so naming it back leaks nothing.
        return wrong_role(method, role, f"the agent certificate of host {host[:253]!r}")
    return wrong_role(method, role, "a rule in coordinator/authorization.py")
