"""Host registrations: `hosts/<host_id>` under an etcd lease (docs/design.md §4).

Guarantee: registration is create-only while the previous registration's lease lives, so a second
agent claiming a live host id is refused; a heartbeat renews only the lease that registration holds.

Reads for decisions come from a cache that an etcd watch keeps (`follow`), so a probe, a commit or a
grant reads no registration from etcd. The cache cannot grant anything a fresh read would refuse:
every decision compares the registration it read, on its mod revision, in its own transaction, so
a cached entry that is no longer current makes that transaction lose and nothing is written. A
host the cache does not hold is read from etcd, so a refusal (HOST_NOT_REGISTERED) never rests on
a watch that lags; while no watch is established every read goes to etcd.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import grpc

from holdfast.common import identifiers
from holdfast.common.reasons import Reason
from holdfast.coordinator import fence_rules, keys, protojson, records
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.store import (
    Compacted,
    Entry,
    Put,
    Seen,
    Store,
    StoreUnavailable,
    absent,
    unchanged,
)
from holdfast.v1 import coordinator_pb2 as pb

log = logging.getLogger(__name__)
MIN_TTL, DEFAULT_TTL, MAX_TTL = 2, 10, 60
REFOLLOW_S = 1.0


class Registry:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, Entry] | None = None  # None: not following, read etcd
        self.following = asyncio.Event()  # set while the cache follows etcd (tests wait on it)

    async def follow(self) -> None:
        """Keeps the cache equal to etcd's registrations through a watch; runs until cancelled. A
        lost watch (etcd unreachable, compacted) drops the cache until a new listing replaces it."""
        prefix = keys.hosts_prefix(self.store)
        while True:
            try:
                entries, revision = await self.store.snapshot_prefix(prefix)
                self._cache = {entry.key: entry for entry in entries}
                self.following.set()
                async for change in self.store.watch_prefix(prefix, revision + 1):
                    if isinstance(change, str):
                        self._cache.pop(change, None)
                    else:
                        self._cache[change.key] = change
            except (StoreUnavailable, Compacted, grpc.aio.AioRpcError) as exc:
                log.warning("registration watch lost (%s); reading etcd until it is back", exc)
            finally:
                self._cache = None
                self.following.clear()
            await asyncio.sleep(REFOLLOW_S)

    def key_of(self, host_id: str) -> str:
        return keys.host(self.store, host_id)

    async def register(self, reg: pb.HostRegistration, ttl: int, node_uid: str = "") -> tuple[int, int]:
        """`node_uid`: the Node uid of the caller's verified certificate (tls.peer_node_uid)."""
        identifiers.check_host_id(reg.host_id)
        identifiers.check_text("address", reg.address, 256)
        if not reg.address or not reg.spawn_token_env:
            raise identifiers.InvalidInput("registration needs an address and a spawn-token variable")
        ttl = min(max(ttl or DEFAULT_TTL, MIN_TTL), MAX_TTL)
        key = self.key_of(reg.host_id)
        # The fencing gates, compared in the registration's transaction: a fence that starts
        # meanwhile (it compares this registration absent) and this registration exclude each other.
        gates = await self.store.read_all([keys.fence_pending(self.store, reg.host_id),
                                           keys.fenced(self.store, reg.host_id)])
        fenced = gates[1].entry
        refused = fence_rules.registration_refused(
            reg.incarnation, gates[0].entry is not None,
            protojson.parse(fenced.value, pb.FenceAttempt) if fenced is not None else None)
        if refused:
            refuse_fenced(reg, refused, gates[0].entry is None)
        lease_id = await self.store.grant_lease(ttl)
        stored = pb.HostRegistration()
        stored.CopyFrom(reg)
        stored.registered_at_unix_ms = int(time.time() * 1000)
        stored.lease_id = lease_id
        stored.node_uid = node_uid  # the certificate's, whatever the request said
        value = records.encode(stored)
        # The last registration is also kept without a lease: its incarnation is what a fence of
        # this host, after the lease lapsed, proves off, and its Node uid the Node whose
        # out-of-service taint may prove it.
        last = Put(keys.host_last(self.store, reg.host_id), value)
        ok, revision = await self.store.txn([absent(key), *unchanged(gates)],
                                            [Put(key, value, lease_id), last])
        if not ok:
            await self.store.revoke_lease(lease_id)
            # Why it lost is read as etcd held the id when it compared (the transaction's revision),
            # not now: a registration there may have lapsed since, and a gate may have moved back
            # (an attempt that began and failed: its pending key gone, no proof left).
            try:
                held = await self.store.get(key, revision) is not None
            except Compacted as exc:
                raise StoreUnavailable(f"registration of {reg.host_id} lost and {exc}") from exc
            if not held:
                raise CoordinatorError(Reason.HOST_FENCING, f"host {reg.host_id}: a fence of it started or "
                                       "ended while it registered; nothing was written, register again")
            log.warning(
                "refused registration of host %s from %s: a live registration holds the id",
                reg.host_id,
                reg.address,
            )
            raise CoordinatorError(Reason.HOST_LIVE,
                                   f"host id {reg.host_id} is registered and its lease is live")
        return lease_id, ttl

    async def heartbeat(self, host_id: str, lease_id: int) -> int:
        identifiers.check_host_id(host_id)
        entry = await self.store.get(self.key_of(host_id))
        if entry is None or entry.lease != lease_id:
            raise CoordinatorError(Reason.NOT_FOUND, f"no live registration of {host_id} under that lease")
        ttl = await self.store.refresh_lease(lease_id)
        if ttl <= 0:
            raise CoordinatorError(Reason.NOT_FOUND, f"the registration of {host_id} expired; register again")
        return ttl

    async def get(self, host_id: str) -> pb.HostRegistration | None:
        return decode(await self.seen(host_id))

    async def seen(self, host_id: str) -> Seen:
        """The registration as a decision reads it, to be compared in that decision's transaction."""
        return self.cached(host_id) or await self.store.read(self.key_of(host_id))

    def cached(self, host_id: str) -> Seen | None:
        """The registration from the followed cache; None when the cache does not hold it (then it is
        read from etcd, never taken as absent)."""
        key = self.key_of(host_id)
        cached = self._cache.get(key) if self._cache is not None else None
        return Seen(key, cached) if cached is not None else None

    async def list(self) -> list[pb.HostRegistration]:
        entries, _ = await self.store.list_prefix(keys.hosts_prefix(self.store))
        return [protojson.parse(e.value, pb.HostRegistration) for e in entries]


def decode(seen: Seen) -> pb.HostRegistration | None:
    return pb.HostRegistration.FromString(_parsed(seen.entry.value)) if seen.entry else None


@functools.lru_cache(maxsize=4096)
def _parsed(raw: bytes) -> bytes:
    """A registration's JSON parsed once (a grant decodes its host's ~4 times), kept by its bytes:
    the same bytes always parse to the same message, so a hit is the parse of exactly what was read;
    each caller gets a message of its own."""
    return protojson.parse(raw, pb.HostRegistration).SerializeToString()


def refuse_fenced(reg: pb.HostRegistration, why: str, fenced_incarnation: bool) -> None:
    """RegisterHost refused by a fence: while one runs (HOST_FENCING), or loudly, for the very
    incarnation a fence proved off (HOST_FENCED: the device lied, or fenced another machine; the
    refusal counter carries it to the alert)."""
    if fenced_incarnation:
        log.error("refused registration of host %s from %s: %s", reg.host_id, reg.address, why,
                  extra={"fields": {"host": reg.host_id, "alert": "fenced-host-alive"}})
        raise CoordinatorError(Reason.HOST_FENCED, f"host {reg.host_id}: {why}; stop it and check its fencer")
    log.warning("refused registration of host %s from %s: %s", reg.host_id, reg.address, why)
    raise CoordinatorError(Reason.HOST_FENCING, f"host {reg.host_id}: {why}; it registers once the attempt "
                           "ends")
