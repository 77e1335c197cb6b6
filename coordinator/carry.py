"""Carried state in etcd (`holdfast run --carry`, docs/carry.md): an owner's files, uploaded under its
own grant, for the next owner to restore before its CMD runs.

Guarantee: every write is one etcd transaction that compares the writer's `fence/<id>` key as read,
holding its fence (committed or live) and its secret's hash, so a superseded owner's upload is
refused whole; the manifest names one of two slots and a new copy is written into the other, so the last
committed copy stays readable until a whole new one — every chunk present and matching its sha256,
checked here — is committed. Space is reserved against the cluster-wide budget (`carry-budget`)
before any chunk is stored, in the transaction that also clears the slot, so carried state never
grows past the budget (etcd at its quota refuses every write, heartbeats included).

Keys (holdfast.coordinator.keys): `carry/<id>/manifest`, `carry/<id>/slot/<s>` (the reservation:
fence, bytes, chunks), `carry/<id>/chunk/<s>/<index>`, and `carry-budget`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass

from holdfast.common import carry_rules, identifiers
from holdfast.common.reasons import Reason
from holdfast.coordinator import fencing, keys, protojson, records
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.sessions import Sessions, now_ms
from holdfast.coordinator.store import Put, Seen, Store, unchanged
from holdfast.v1 import coordinator_pb2 as pb

CHUNK_BYTES = carry_rules.CHUNK_BYTES
DEFAULT_SESSION_CAP = 4 << 20
MAX_SESSION_CAP = 32 << 20  # 64 chunks: a commit compares each, and etcd allows 128 ops a transaction
DEFAULT_BUDGET = 512 << 20  # 25 % of etcd's default 2 GiB quota
MANIFEST_LIMIT = carry_rules.MANIFEST_BYTES  # the one a pack checks too, before it uploads
BUDGET_RETRIES = 16  # other sessions' reservations move the budget key meanwhile


@dataclass(frozen=True)
class Reservation:
    fence: int
    reserved: int
    chunks: int

    @classmethod
    def of(cls, seen: Seen) -> Reservation | None:
        if seen.entry is None:
            return None
        raw = json.loads(seen.entry.value)
        return cls(int(raw["fence"]), int(raw["reserved"]), int(raw["chunks"]))

    def encode(self) -> bytes:
        return json.dumps({"fence": self.fence, "reserved": self.reserved, "chunks": self.chunks}).encode()


def chunks_for(total: int) -> int:
    return -(-total // CHUNK_BYTES)


def budget_used(seen: Seen) -> int:
    return int(json.loads(seen.entry.value)["reserved_bytes"]) if seen.entry is not None else 0


def budget_value(used: int) -> bytes:
    return json.dumps({"reserved_bytes": max(used, 0)}).encode()


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
    def __init__(
        self, sessions: Sessions, session_cap: int = DEFAULT_SESSION_CAP, budget: int = DEFAULT_BUDGET
    ) -> None:
        if not 0 < session_cap <= MAX_SESSION_CAP:
            raise ValueError(f"carry session cap {session_cap} is outside 1..{MAX_SESSION_CAP} bytes")
        self.sessions = sessions
        self.store: Store = sessions.store
        self.session_cap = session_cap
        self.budget = budget

    def budget_key(self) -> str:
        return keys.carry_budget(self.store)

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
            raise CoordinatorError(
                Reason.CARRY_TOO_LARGE,
                f"carried state of {request.total_bytes} bytes is over "
                f"this coordinator's per-session cap of {self.session_cap} bytes",
            )
        if request.chunks != chunks_for(request.total_bytes):
            raise identifiers.InvalidInput(
                f"{request.total_bytes} bytes are {chunks_for(request.total_bytes)} "
                f"chunks of {CHUNK_BYTES}, not {request.chunks}"
            )
        for _ in range(BUDGET_RETRIES):
            fence_seen = await self._owner_fence(sid, request.fence, request.secret)
            manifest_seen, budget_seen = await asyncio.gather(
                self.store.read(keys.carry_manifest(self.store, sid)), self.store.read(self.budget_key())
            )
            current = decode_manifest(manifest_seen)
            slot = 1 - current.slot if current is not None else 0
            slot_seen = await self.store.read(keys.carry_slot(self.store, sid, slot))
            old = Reservation.of(slot_seen)
            used = budget_used(budget_seen) - (old.reserved if old else 0) + request.total_bytes
            if used > self.budget:
                raise CoordinatorError(
                    Reason.CARRY_BUDGET_EXHAUSTED,
                    f"reserving {request.total_bytes} bytes would "
                    f"bring the cluster's carried state to {used} of its {self.budget}-byte "
                    "budget; nothing was written",
                )
            reservation = Reservation(request.fence, request.total_bytes, request.chunks)
            ok, _ = await self.store.txn(
                unchanged([fence_seen, manifest_seen, budget_seen, slot_seen]),
                [Put(slot_seen.key, reservation.encode()), Put(budget_seen.key, budget_value(used))],
                delete_prefixes=[keys.carry_chunks_prefix(self.store, sid, slot)],
            )
            if ok:
                return slot
        raise CoordinatorError(Reason.UNAVAILABLE,
                               "the carry budget kept changing under this reservation; retry")

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
        """Points the manifest at the reserved slot once every chunk matches it; the revision."""
        sid = identifiers.check_session_id(request.session_id)
        manifest = pb.CarryManifest()
        manifest.CopyFrom(request.manifest)
        if manifest.slot not in (0, 1) or manifest.session_id != sid or manifest.fence != request.fence:
            raise identifiers.InvalidInput(
                "the manifest must name this session, this grant's fence and slot 0 or 1"
            )
        fence_seen = await self._owner_fence(sid, request.fence, request.secret)
        manifest_seen, slot_seen = await asyncio.gather(
            self.store.read(keys.carry_manifest(self.store, sid)),
            self.store.read(keys.carry_slot(self.store, sid, manifest.slot)),
        )
        reservation = Reservation.of(slot_seen)
        current = decode_manifest(manifest_seen)
        if (
            reservation is None
            or reservation.fence != request.fence
            or (current is not None and current.slot == manifest.slot)
        ):
            raise identifiers.InvalidInput(
                f"slot {manifest.slot} holds no reservation of fence {request.fence} "
                "beside the current copy: BeginCarry first"
            )
        check_manifest_shape(manifest, reservation)
        stored, _ = await self.store.list_prefix(keys.carry_chunks_prefix(self.store, sid, manifest.slot))
        hashes = [hashlib.sha256(e.value).hexdigest() for e in stored]
        if hashes != list(manifest.chunk_sha256) or sum(len(e.value) for e in stored) != reservation.reserved:
            raise CoordinatorError(
                Reason.CARRY_CORRUPT,
                f"slot {manifest.slot} holds {len(stored)} chunks that do not "
                f"match the manifest's {len(manifest.chunk_sha256)}; nothing was committed",
            )
        manifest.schema_version = records.SCHEMA_VERSION
        manifest.written_at_unix_ms = now_ms()
        chunk_reads = [Seen(e.key, e) for e in stored]
        ok, revision = await self.store.txn(
            unchanged([fence_seen, manifest_seen, slot_seen, *chunk_reads]),
            [Put(manifest_seen.key, records.encode(manifest))],
        )
        if not ok:
            raise CoordinatorError(
                Reason.STALE_FENCE, "the grant or the carried state changed; nothing was committed"
            )
        return revision

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

    # --- with the session ----------------------------------------------------------------------------
    async def discard(self, sid: str) -> tuple[list[Seen], list[Put]]:
        """What archiving a session must compare and put so its carried state goes with it: the two
        reservations and the budget as read, and the budget less what they held. The caller deletes
        `prefix(sid)` in the same transaction."""
        slots = await asyncio.gather(*(self.store.read(keys.carry_slot(self.store, sid, s)) for s in (0, 1)))
        held = sum(r.reserved for r in map(Reservation.of, slots) if r is not None)
        if not held:
            return list(slots), []
        budget_seen = await self.store.read(self.budget_key())
        return [*slots, budget_seen], [Put(budget_seen.key, budget_value(budget_used(budget_seen) - held))]
