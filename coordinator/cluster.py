"""The identity of one holdfast cluster: the etcd keyspace under one prefix that fences live in.

Guarantee: every coordinator over the same etcd and prefix reports the same identity, and two
holdfast clusters (two etcds, or two prefixes of one etcd) report different ones. It is a random
128-bit value written once, create-only, at `<prefix>cluster-id`; a coordinator that loses the
race to create it reads the winner's. Grants carry it, so a grant minted by one cluster is refused
by another's coordinators (WRONG_CLUSTER) and a client notices when one run's calls reach two
clusters (two `holdfast up` on one port). etcd's own cluster id is not used: it is derived
from the member configuration, so identically configured clusters share it, and it cannot tell two
prefixes of one etcd apart (docs/decisions.md). Only coordinator start-up and a grant's own
transaction create it: a refused call never writes, not even the identity.
"""

from __future__ import annotations

import asyncio
import re
import secrets

from holdfast.coordinator import keys
from holdfast.coordinator.store import Put, Seen, Store, StoreUnavailable, absent

_VALID = re.compile(r"^[0-9a-f]{32}$")


def _fresh() -> str:
    return secrets.token_hex(16)  # 128 random bits, the shape _VALID reads back


class ClusterIdentity:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._known = ""
        self._lock = asyncio.Lock()

    async def current(self) -> str:
        """The identity, read once and then kept (it never changes while the keyspace exists); ''
        while none was made yet — then this keyspace has minted no grant that could carry one.
        StoreUnavailable when etcd cannot be reached."""
        if not self._known:
            self._known = await self._read()
        return self._known

    async def ensure(self) -> str:
        """The identity, created (once, create-only) if this keyspace has none yet."""
        if self._known:
            return self._known
        async with self._lock:
            for _ in range(3):
                if value := await self._read():
                    self._known = value
                    return value
                # The loser of a race to create it reads the winner's on the next pass.
                await self.store.txn([absent(self._key)], [Put(self._key, _fresh().encode())])
        raise StoreUnavailable(f"{self._key} could neither be read nor created")

    async def for_grant(self) -> tuple[str, list[Seen], list[Put]]:
        """The identity a grant carries, and what the grant's transaction adds for it: nothing when
        the keyspace has one; else a fresh one, compared absent and created by that transaction, so
        a grant that loses its race or is refused creates none (the start-up could not, etcd being
        down then), and two grants minting at once cannot both apply."""
        if known := await self.current():
            return known, [], []
        value = _fresh()
        return value, [Seen(self._key, None)], [Put(self._key, value.encode())]

    @property
    def _key(self) -> str:
        return keys.cluster_id(self.store)

    async def _read(self) -> str:
        entry = await self.store.get(self._key)
        if entry is None:
            return ""
        value = entry.value.decode(errors="replace").strip()
        if not _VALID.fullmatch(value):
            # Never replaced: a rewritten identity would turn every live grant away.
            raise StoreUnavailable(f"{self._key} holds {value[:40]!r}, not a cluster identity; fix it by "
                                   "hand (docs/decisions.md)")
        return value
