"""Who may call which Coordinator RPC, by the role in the caller's verified certificate.

Guarantee (with TLS): only an agent certificate naming host H may RegisterHost or Heartbeat H;
only a client or coordinator certificate may change a session; any certificate of the CA may read;
a method not listed here is refused. A pure rule: the gate in holdfast.agent.authorization runs it
before the handler, so a refusal writes nothing. The grant secret is still checked by the service
for every owner write: a certificate says who may ask, never which grant is theirs.
"""

from __future__ import annotations

from holdfast.agent.authorization import Refusal, no_role, wrong_role
from holdfast.agent.tls import Role
from holdfast.v1 import coordinator_pb2 as pb

READS = frozenset({"GetSession", "ListSessions", "WatchSessions", "ListHosts", "FencedGet", "ProbeSession",
                   "GetArchivedSession"})
# Operator lifecycle calls (coordinator/lifecycle.py) change sessions too: the same writers.
SESSION_WRITES = frozenset({"Acquire", "CommitOwner", "RecordProviderHandle", "Release", "RequestHandoff",
                            "FencedPut", "Recover", "ArchiveSession", "PurgeArchives", "DrainHost",
                            "RecoverHost", "RestoreEpoch"})
HOST_CALLS = frozenset({"RegisterHost", "Heartbeat"})
WRITER_KINDS = ("client", "coordinator")


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
    if method in HOST_CALLS:
        host = _host_of(method, request)
        if role.kind == "agent" and role.name == host:
            return None
        # The requested host id is the caller's own claim, so naming it back leaks nothing.
        return wrong_role(method, role, f"the agent certificate of host {host[:253]!r}")
    return wrong_role(method, role, "a rule in coordinator/authorization.py")
