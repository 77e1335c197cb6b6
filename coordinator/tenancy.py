"""Which tenant a caller acts for, and whether a session is that tenant's (docs/tenants.md).

Guarantee: a session belongs to the tenant that first acquired it — written in its record when the
record is made, in the grant's own transaction (compared absent), and never changed; kept in its
archive record and in the floor a purge leaves, so a revived id is judged too. A record with no
tenant (written before tenants) belongs to the configured default tenant, never to whoever acquires
it next. A caller of another tenant is refused WRONG_TENANT by `admit` before its handler reads
anything for the session, asks an agent or writes anything; the refusal is logged with both
identities and counted. A caller of one tenant on an id no tenant holds yet gets from `admit` no
leave to read it: another tenant may make it before the handler's own read. A binding once read is
kept (`BINDINGS_KEPT`), since it never changes: it admits again, without a read, only the RPCs in
`JUDGED_ON_READ`, whose handlers judge every record they read — so after an etcd restored from a
backup, where an id may be bound anew, they still act on none of another tenant's; a kept binding
that would refuse is read again first, so a refusal rests on a fresh read. Not isolated: an
all-tenants operator (its certificate says so); a plaintext coordinator (no identities at all: every
caller is the default tenant and sees every session).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from holdfast.common import identifiers
from holdfast.common.reasons import Reason
from holdfast.common.tls import ALL_TENANTS, peer_role
from holdfast.coordinator import keys, metrics, records
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.store import Store
from holdfast.v1 import coordinator_pb2 as pb

log = logging.getLogger(__name__)
DEFAULT_TENANT = "default"
# Only a runtime's and an operator's certificates act for a tenant. Every other kind acts for none:
# an infrastructure key that never calls a session RPC — an agent's (one on every node; the agent CA
# mints them), a coordinator's (one in every replica, used to dial agents), the retention job's —
# or a kind a CA holder mints that no rule names, stolen, would otherwise read the default tenant's
# sessions, fenced data and carried files cluster-wide. An allowlist: a new kind acts for no tenant
# until one is given to it here. No record's tenant is "".
TENANT_KINDS = ("client", "operator")
# The RPCs admitted here whose handlers judge the tenant of every record they read (Release the record
# it decides on, WatchSessions every record it would show): a kept binding admits them without a
# read. A `run` makes both each cycle (its Acquire judges its own readings and is not admitted here);
# with a binding read each time, mTLS cost two etcd reads a cycle.
JUDGED_ON_READ = frozenset({"Release", "WatchSessions"})
BINDINGS_KEPT = 100_000  # session id -> tenant, ~0.1 KB each: past it, kept ones are dropped


@dataclass(frozen=True)
class Caller:
    """The tenant a caller's sessions are bound to, and whether it may act on every tenant's."""

    tenant: str
    all_tenants: bool
    who: str  # the certificate's role and tenant, for the audit log

    def may_act_on(self, tenant: str) -> bool:
        return self.all_tenants or tenant == self.tenant


def caller(context: grpc.aio.ServicerContext, default: str) -> Caller:
    role = peer_role(context)
    if role is None:
        # TLS refuses a call without a role at the gate, but a certificate may lapse after the gate
        # admitted its call: it then acts for no tenant, never as a plaintext link (every tenant).
        if context.auth_context().get("x509_pem_cert"):
            return Caller("", False, "an expired certificate")
        return Caller(default, True, "plaintext")
    who = " ".join(filter(None, (role.uri(), role.tenant_uri())))
    if role.tenant == ALL_TENANTS:
        return Caller(default, True, who)
    if role.kind not in TENANT_KINDS:
        return Caller("", False, who)
    return Caller(role.tenant or default, False, who)


def tenant_of(record: pb.SessionRecord, default: str) -> str:
    return record.tenant or default


class Tenancy:
    def __init__(self, store: Store, default: str = DEFAULT_TENANT) -> None:
        self.store = store
        self.default = default
        self._bindings: dict[str, str] = {}  # session id -> the tenant its record or archive names

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        return caller(context, self.default)

    def judge(self, rpc: str, sid: str, found: pb.SessionRecord | None, who: Caller) -> None:
        """Refuses WRONG_TENANT when `found` (the session's record, or its archive) is another
        tenant's; a session never seen is any tenant's to create, and no one's who acts for no tenant
        (the record would name none, which reads as the default tenant's: a stolen infrastructure
        key would squat the default tenant's ids)."""
        if found is None and (who.tenant or who.all_tenants):
            return
        if found is not None and self.allows(who, found):
            return
        metrics.TENANT_REFUSALS.labels(rpc).inc()
        log.warning("refused %s of session %s: caller %s (tenant %s), session of tenant %s", rpc, sid,
                    who.who, who.tenant or "none", tenant_of(found, self.default) if found else "none yet")
        raise CoordinatorError(Reason.WRONG_TENANT, (f"session {sid} belongs to another tenant" if found
                                                     else "a certificate of no tenant creates no session")
                               + "; nothing was read for it, asked or written")

    def allows(self, who: Caller, found: pb.SessionRecord) -> bool:
        """Whether `who` may act on the session `found` binds; unlike `judge`, logs and counts nothing."""
        return who.may_act_on(tenant_of(found, self.default))

    async def bound(self, sid: str) -> pb.SessionRecord | None:
        """What binds the id to a tenant: its record, else its archive record (or floor). Both at one
        revision: read apart, an archive landing between the two reads (record deleted, archive
        record put, in one transaction) would show neither, and the id would look unheld."""
        live, archived = await self.store.read_all([keys.session(self.store, sid),
                                                    keys.archive_record(self.store, sid)])
        found = live.entry or archived.entry
        return records.decode_record(found.value) if found is not None else None

    async def admit(self, rpc: str, sid: str, context: grpc.aio.ServicerContext) -> Caller | None:
        """The caller, once it may act on the session; WRONG_TENANT otherwise. None for a caller
        scoped to one tenant on an id no tenant holds: its handler must then read nothing for the
        id, for another tenant may make it between this read and the handler's own, which would act
        on that tenant's new record (answer it, ask its agent, hand it off, recover it). Past a
        Caller, every read finds the caller's own tenant's session or none: a binding, once made,
        never changes and never goes (an archive keeps it, and so does a purge's floor)."""
        sid = identifiers.check_session_id(sid)
        who = self.caller(context)
        if who.all_tenants:
            return who
        if rpc in JUDGED_ON_READ and who.may_act_on(self._bindings.get(sid, "")):
            return who
        found = await self.bound(sid)
        if found is not None:
            if len(self._bindings) >= BINDINGS_KEPT:
                self._bindings.clear()
            self._bindings[sid] = tenant_of(found, self.default)
        self.judge(rpc, sid, found, who)
        return who if found is not None else None

    def retention_scope(self, context: grpc.aio.ServicerContext) -> Callable[[pb.SessionRecord], bool]:
        """Whose archives a purge drops: every tenant's for the maintenance role (the retention
        CronJob, cluster-wide as ever) and an all-tenants operator; an operator of one tenant its
        own alone — else it dropped other tenants' archived history and was told their ids."""
        role, who = peer_role(context), self.caller(context)
        if role is not None and role.kind == "maintenance":
            return lambda _: True
        return lambda record: who.may_act_on(tenant_of(record, self.default))

    def require_all(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        """A call whose effect reaches every tenant on a host or in the cluster (a drain flag, a
        power-off, a restore epoch) is an all-tenants operator's alone."""
        who = self.caller(context)
        if not who.all_tenants:
            metrics.TENANT_REFUSALS.labels(rpc).inc()
            log.warning("refused %s: caller %s is scoped to tenant %s", rpc, who.who, who.tenant or "none")
            raise CoordinatorError(Reason.WRONG_TENANT, f"{rpc} reaches every tenant's sessions: it needs an "
                                   "operator certificate for all tenants (`holdfast certs issue --role "
                                   "operator --all-tenants`); nothing was done")
