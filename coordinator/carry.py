"""Carried state in etcd (`holdfast run --carry`, docs/carry.md): an owner's files, uploaded under its
own grant, for the next owner to restore before its CMD runs.

Guarantee: every write is one etcd transaction that compares the writer's `fence/<id>` key as read,
holding its fence (committed or live) and its secret's hash, so a superseded owner's upload is
refused whole; the manifest names one of two slots and a new copy is written into the other, so the last
committed copy stays readable until a whole new one — every chunk present and matching its sha256,
checked here — is committed. Space is reserved against the cluster-wide budget (`carry-budget`)
and the budget of the tenant the session's record names (`carry-budget/<tenant>`) before any chunk
is stored, in the transaction that also clears the slot and compares the record, both budget keys
and every slot as read, so carried state never grows past the cluster's budget (etcd at its quota
refuses every write, heartbeats included) nor a tenant's past its own: one tenant's uploads cannot
spend the rest of the cluster's budget when a per-tenant budget is set. The slot names the tenant
charged, and a give-back returns its bytes to exactly that tenant and the cluster
(coordinator/carry_budget_rules.py), in the transaction that deletes the slot.

Keys (holdfast.coordinator.keys): `carry/<id>/manifest`, `carry/<id>/slot/<s>` (the reservation:
fence, bytes, chunks, tenant charged), `carry/<id>/chunk/<s>/<index>`, `carry-budget` and
`carry-budget/<tenant>`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from holdfast.common import carry_rules, identifiers
from holdfast.common.reasons import Reason
from holdfast.coordinator import carry_budget_rules as budgets
from holdfast.coordinator import fencing, keys, protojson, records
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import Put, Seen, Store, unchanged
from holdfast.coordinator.tenancy import DEFAULT_TENANT, tenant_of
from holdfast.v1 import coordinator_pb2 as pb

CHUNK_BYTES = carry_rules.CHUNK_BYTES
MANIFEST_LIMIT = carry_rules.MANIFEST_BYTES  # the one a pack checks too, before it uploads
BUDGET_RETRIES = 16  # other sessions' reservations move the budget keys meanwhile


@dataclass(frozen=True)
class Reservation:
    fence: int
    reserved: int
    chunks: int
    # The tenant its bytes were charged to, given back to it alone; budgets.CLUSTER in a slot reserved
    # before per-tenant budgets (no "tenant" field), charged to the cluster's budget alone.
    tenant: str = budgets.CLUSTER

    @classmethod
    def of(cls, seen: Seen) -> Reservation | None:
        if seen.entry is None:
            return None
        raw = json.loads(seen.entry.value)
        return cls(int(raw["fence"]), int(raw["reserved"]), int(raw["chunks"]),
                   str(raw.get("tenant", budgets.CLUSTER)))

    def encode(self) -> bytes:
        return json.dumps({"fence": self.fence, "reserved": self.reserved, "chunks": self.chunks,
                           "tenant": self.tenant}).encode()

    def charge(self) -> budgets.Charge:
        return budgets.Charge(self.tenant, self.reserved)


def chunks_for(total: int) -> int:
    return -(-total // CHUNK_BYTES)


def budget_used(seen: Seen) -> int:
    return int(json.loads(seen.entry.value)["reserved_bytes"]) if seen.entry is not None else 0


def budget_value(used: int) -> bytes:
    return json.dumps({"reserved_bytes": used}).encode()


async def reserved(store: Store) -> tuple[int, dict[str, int]]:
    """The bytes reserved against the cluster's budget, and against each tenant's (the census)."""
    cluster = budget_used(await store.read(keys.carry_budget(store)))
    prefix = keys.carry_tenant_budgets_prefix(store)
    tenants, _ = await store.list_prefix(prefix)
    return cluster, {e.key.removeprefix(prefix): budget_used(Seen(e.key, e)) for e in tenants}


def decode_manifest(seen: Seen) -> pb.CarryManifest | None:
    return protojson.parse(seen.entry.value, pb.CarryManifest) if seen.entry is not None else None


def check_manifest_shape(manifest: pb.CarryManifest, reservation: Reservation) -> None:
    """The manifest against its reservation and every rule a restore applies (carry_rules): a copy
    no restore may write is refused when it is uploaded, not only when it is restored. The
    restoring client checks it all again: it trusts nothing it did not verify."""
    size = len(records.encode(manifest))
    if len(manifest.entries) > carry_rules.MAX_ENTRIES or size > MANIFEST_LIMIT:
        raise CoordinatorError(
            Reason.CARRY_TOO_LARGE,
            f"the manifest holds {len(manifest.entries)} entries ({size} bytes); the limit is "
            f"{carry_rules.MAX_ENTRIES} entries, {MANIFEST_LIMIT} bytes; nothing was committed",
        )
    try:
        carry_rules.check_manifest(manifest)
    except carry_rules.CarryRefused as exc:
        raise identifiers.InvalidInput(f"the carried copy is refused: {exc}; nothing was committed") from None
    if manifest.total_bytes != reservation.reserved or len(manifest.chunk_sha256) != reservation.chunks:
        raise identifiers.InvalidInput(
            f"the manifest's {manifest.total_bytes} bytes in {len(manifest.chunk_sha256)} chunks do not "
            f"match the {reservation.reserved} bytes in {reservation.chunks} chunks reserved"
        )


class CarryStore:
    def __init__(self, sessions: Sessions, limits: budgets.CarryLimits = budgets.DEFAULT_LIMITS,
                 default_tenant: str = DEFAULT_TENANT) -> None:
        self.sessions = sessions
        self.store: Store = sessions.store
        self.limits = limits
        self.session_cap = limits.session_cap
        self.default_tenant = default_tenant

    def budget_key(self, account: str = budgets.CLUSTER) -> str:
        """The cluster's budget key, or a tenant's."""
        if account == budgets.CLUSTER:
            return keys.carry_budget(self.store)
        return keys.carry_tenant_budget(self.store, account)

    async def _ledger(self, moved: dict[str, int]) -> tuple[dict[str, int], list[Seen], list[Put]]:
        """The accounts `moved` touches: their reserved bytes and keys as read (at one revision; the
        caller compares every one), and the puts that move them — none for an account left as it was."""
        names = sorted(moved)
        seen = await self.store.read_all([self.budget_key(a) for a in names])
        used = {a: budget_used(s) for a, s in zip(names, seen, strict=True)}
        totals = budgets.after(used, moved)
        puts = [Put(s.key, budget_value(totals[a])) for a, s in zip(names, seen, strict=True) if moved[a]]
        return used, seen, puts

    def prefix(self, sid: str) -> str:
        return keys.carry_prefix(self.store, sid)

    # --- the owner's grant -------------------------------------------------------------------------
    async def _owner_fence(self, sid: str, fence: int, secret: str) -> Seen:
        """`fence/<id>` as read, when it is this grant's (committed or live); else the refusal the
        record explains (stale fence, wrong secret, not an owner)."""
        identifiers.check_fence(fence)
        seen = await self.store.read(keys.fence(self.store, sid))
        if seen.entry is not None and seen.entry.value.decode() in fencing.owner_fence_values(fence, secret):
            return seen
        _, record = await self.sessions.require(sid)
        fencing.check_grant(record, fence, secret)
        raise CoordinatorError(Reason.NOT_LIVE,
                               "carried state is written by the session's committed owner only")

    # --- writes --------------------------------------------------------------------------------------
    async def begin(self, request: pb.BeginCarryRequest) -> int:
        """Reserves `total_bytes` in the slot the manifest does not name, clearing what it held; the slot."""
        sid = identifiers.check_session_id(request.session_id)
        if request.total_bytes > self.session_cap:
            raise CoordinatorError(Reason.CARRY_TOO_LARGE, carry_rules.over_cap(
                "the carried state", request.total_bytes, self.session_cap))
        if request.chunks != chunks_for(request.total_bytes):
            raise identifiers.InvalidInput(
                f"{request.total_bytes} bytes are {chunks_for(request.total_bytes)} "
                f"chunks of {CHUNK_BYTES}, not {request.chunks}"
            )
        for _ in range(BUDGET_RETRIES):
            fence_seen = await self._owner_fence(sid, request.fence, request.secret)
            # The record names the tenant charged; compared below, so the charge is the tenant of
            # the record as it stands when the reservation lands.
            record_seen, manifest_seen = await self.store.read_all(
                [keys.session(self.store, sid), keys.carry_manifest(self.store, sid)])
            if record_seen.entry is None:
                continue  # archived since the fence was read: the next read of it refuses
            tenant = tenant_of(self.sessions.decode(record_seen.entry), self.default_tenant)
            current = decode_manifest(manifest_seen)
            slot = 1 - current.slot if current is not None else 0
            slot_seen, kept_seen = await self.store.read_all(
                [keys.carry_slot(self.store, sid, slot), keys.carry_slot(self.store, sid, 1 - slot)])
            reservation = Reservation(request.fence, request.total_bytes, request.chunks, tenant)
            given_back, taken = [], [reservation.charge()]
            puts = [Put(slot_seen.key, reservation.encode())]
            old, kept = Reservation.of(slot_seen), Reservation.of(kept_seen)
            if old is not None:
                given_back.append(old.charge())
            if kept is not None and kept.tenant == budgets.CLUSTER:
                # The copy kept was reserved before per-tenant budgets: from its session's next
                # upload on it counts against its tenant too, or a tenant's old copies went uncounted.
                adopted = replace(kept, tenant=tenant)
                given_back.append(kept.charge())
                taken.append(adopted.charge())
                puts.append(Put(kept_seen.key, adopted.encode()))
            moved = budgets.moves(given_back, taken)
            used, budgets_seen, budget_puts = await self._ledger(moved)
            why = budgets.refusal(used, moved, self.limits)
            if why is not None:
                raise CoordinatorError(Reason.CARRY_BUDGET_EXHAUSTED, f"reserving {request.total_bytes} "
                                       f"bytes for {sid}: {why}; nothing was written")
            ok, _ = await self.store.txn(
                unchanged([fence_seen, record_seen, manifest_seen, slot_seen, kept_seen, *budgets_seen]),
                [*puts, *budget_puts],
                delete_prefixes=[keys.carry_chunks_prefix(self.store, sid, slot)],
            )
            if ok:
                return slot
        raise CoordinatorError(Reason.UNAVAILABLE,
                               "the carry budgets kept changing under this reservation; retry")

    async def put_chunk(self, request: pb.PutCarryChunkRequest) -> None:
        sid = identifiers.check_session_id(request.session_id)
        if request.slot not in (0, 1):
            raise identifiers.InvalidInput("carry slot must be 0 or 1")
        if len(request.data) > CHUNK_BYTES:
            raise identifiers.InvalidInput(
                f"a carry chunk is at most {CHUNK_BYTES} bytes, not {len(request.data)}"
            )
        fence_seen = await self._owner_fence(sid, request.fence, request.secret)
        slot_seen = await self.store.read(keys.carry_slot(self.store, sid, request.slot))
        reservation = Reservation.of(slot_seen)
        if reservation is None or reservation.fence != request.fence:
            raise identifiers.InvalidInput(
                f"slot {request.slot} is not reserved by fence {request.fence}: BeginCarry first"
            )
        if request.index >= reservation.chunks or (
            request.index * CHUNK_BYTES + len(request.data) > reservation.reserved
        ):
            raise identifiers.InvalidInput(
                f"chunk {request.index} of {len(request.data)} bytes lies outside the "
                f"{reservation.reserved} bytes reserved"
            )
        ok, _ = await self.store.txn(
            unchanged([fence_seen, slot_seen]),
            [Put(keys.carry_chunk(self.store, sid, request.slot, request.index), request.data)],
        )
        if not ok:
            raise CoordinatorError(Reason.STALE_FENCE,
                                   "the grant or its reservation changed; nothing was written")

    async def commit(self, request: pb.CommitCarryRequest) -> int:
        """Points the manifest at the reserved slot once every chunk matches it; the revision. The
        copy names the host the session's record names as its owner's (the agent attested it), not
        the uploader's claim, which `run` and `holdfast show` would print to the next owner."""
        sid = identifiers.check_session_id(request.session_id)
        manifest = pb.CarryManifest()
        manifest.CopyFrom(request.manifest)
        if manifest.slot not in (0, 1) or manifest.session_id != sid or manifest.fence != request.fence:
            raise identifiers.InvalidInput(
                "the manifest must name this session, this grant's fence and slot 0 or 1"
            )
        for _ in range(BUDGET_RETRIES):  # the record moves meanwhile (a handoff asked, a probe answered)
            fence_seen = await self._owner_fence(sid, request.fence, request.secret)
            record_seen, manifest_seen, slot_seen = await self.store.read_all([
                keys.session(self.store, sid), keys.carry_manifest(self.store, sid),
                keys.carry_slot(self.store, sid, manifest.slot)])
            manifest.host_id = self._owner_host(record_seen, request.fence)
            stored = await self._checked_chunks(manifest, manifest_seen, slot_seen)
            manifest.schema_version = records.SCHEMA_VERSION
            manifest.written_at_unix_ms = now_ms()
            ok, revision = await self.store.txn(
                unchanged([fence_seen, record_seen, manifest_seen, slot_seen, *stored]),
                [Put(manifest_seen.key, records.encode(manifest))],
            )
            if ok:
                return revision
        raise CoordinatorError(
            Reason.STALE_FENCE, "the grant or the carried state kept changing; nothing was committed"
        )

    def _owner_host(self, record_seen: Seen, fence: int) -> str:
        """The host the record names as the owner of `fence`: attested by that host's agent."""
        record = self.sessions.decode(record_seen.entry) if record_seen.entry is not None else None
        if record is None or record.lease.fence != fence or not record.lease.owner.host_id:
            raise CoordinatorError(Reason.NOT_LIVE,
                                   "carried state is written by the session's committed owner only")
        return record.lease.owner.host_id

    async def _checked_chunks(self, manifest: pb.CarryManifest, manifest_seen: Seen,
                              slot_seen: Seen) -> list[Seen]:
        """The slot's chunks as read, once the manifest, its reservation and every chunk agree."""
        reservation = Reservation.of(slot_seen)
        current = decode_manifest(manifest_seen)
        if (
            reservation is None
            or reservation.fence != manifest.fence
            or (current is not None and current.slot == manifest.slot)
        ):
            raise identifiers.InvalidInput(
                f"slot {manifest.slot} holds no reservation of fence {manifest.fence} "
                "beside the current copy: BeginCarry first"
            )
        check_manifest_shape(manifest, reservation)
        stored, _ = await self.store.list_prefix(
            keys.carry_chunks_prefix(self.store, manifest.session_id, manifest.slot))
        hashes = [hashlib.sha256(e.value).hexdigest() for e in stored]
        if hashes != list(manifest.chunk_sha256) or sum(len(e.value) for e in stored) != reservation.reserved:
            raise CoordinatorError(
                Reason.CARRY_CORRUPT,
                f"slot {manifest.slot} holds {len(stored)} chunks that do not "
                f"match the manifest's {len(manifest.chunk_sha256)}; nothing was committed",
            )
        return [Seen(e.key, e) for e in stored]

    # --- reads ---------------------------------------------------------------------------------------
    async def get(self, request: pb.GetCarryRequest) -> pb.GetCarryResponse:
        """The manifest (any reader), and one chunk of a slot (the committed owner, with its grant).
        Not a snapshot across calls: the restoring client checks every chunk against the manifest's
        hashes and that the manifest did not change."""
        sid = identifiers.check_session_id(request.session_id)
        response = pb.GetCarryResponse(session_cap_bytes=self.session_cap)
        manifest = decode_manifest(await self.store.read(keys.carry_manifest(self.store, sid)))
        if manifest is not None:
            response.found = True
            response.manifest.CopyFrom(manifest)
        if request.with_budget:
            await self._budget(sid, response.budget)
        if request.with_chunk:
            # The files are the session's content, as private as its writer: another session's
            # runtime, or this one's superseded owner, reads the manifest at most.
            await self._owner_fence(sid, request.fence, request.secret)
            entry = await self.store.get(keys.carry_chunk(self.store, sid, request.slot, request.index))
            if entry is None:
                raise CoordinatorError(
                    Reason.NOT_FOUND, f"no chunk {request.index} in slot {request.slot} of {sid}"
                )
            response.chunk = entry.value
        return response

    async def _budget(self, sid: str, out: pb.CarryBudget) -> None:
        """The budgets the session's uploads reserve against: its tenant's (the record's) and the
        cluster's, with their use — for a session with a record; a read, never a decision."""
        record = await self.store.get(keys.session(self.store, sid))
        if record is None:
            return
        out.tenant = tenant_of(self.sessions.decode(record), self.default_tenant)
        cluster, tenant = await self.store.read_all([self.budget_key(), self.budget_key(out.tenant)])
        out.reserved_bytes, out.tenant_reserved_bytes = budget_used(cluster), budget_used(tenant)
        out.budget_bytes, out.tenant_budget_bytes = self.limits.budget, self.limits.tenant_budget

    # --- with the session ----------------------------------------------------------------------------
    async def discard(self, sid: str) -> tuple[list[Seen], list[Put]]:
        """What archiving a session must compare and put so its carried state goes with it: the two
        reservations and the budgets they were charged to as read, and those budgets less what each
        slot held — the cluster's, and the tenant's each slot names. The caller deletes `prefix(sid)`
        in the same transaction."""
        slots = await self.store.read_all([keys.carry_slot(self.store, sid, s) for s in (0, 1)])
        charges = [r.charge() for r in map(Reservation.of, slots) if r is not None and r.reserved]
        if not charges:
            return slots, []
        _, budgets_seen, budget_puts = await self._ledger(budgets.moves(charges, []))
        return [*slots, *budgets_seen], budget_puts
