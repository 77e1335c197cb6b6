"""The identity of one holdfast cluster: the etcd keyspace under one prefix that fences live in.

Guarantee: every coordinator over the same etcd and prefix reports the same identity, and two
holdfast clusters (two etcds, or two prefixes of one etcd) report different ones. It is a random
128-bit value written once, create-only, at `<prefix>cluster-id`; a coordinator that loses the
race to create it reads the winner's. Grants carry it, so a grant minted by one cluster is refused
by another's coordinators (WRONG_CLUSTER) and a client notices when one run's calls reach two
clusters (issue 17: two `holdfast up` on one port). etcd's own cluster id is not used: it is derived
from the member configuration, so identically configured clusters share it, and it cannot tell two
prefixes of one etcd apart (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import re
import secrets

from holdfast.coordinator.store import Put, Store, StoreUnavailable, absent

KEY = "cluster-id"
_VALID = re.compile(r"^[0-9a-f]{32}$")


class ClusterIdentity:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._known = ""
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        """The identity, learnt from etcd once and then kept (it never changes while the keyspace
        exists); StoreUnavailable when etcd cannot be reached, with nothing written."""
        if self._known:
            return self._known
        async with self._lock:
            if not self._known:
                self._known = await self._read_or_create()
        return self._known

    async def _read_or_create(self) -> str:
        key = self.store.key(KEY)
        for _ in range(3):
            entry = await self.store.get(key)
            if entry is not None:
                value = entry.value.decode(errors="replace").strip()
                if not _VALID.fullmatch(value):
                    # Never replaced: a rewritten identity would turn every live grant away.
                    raise StoreUnavailable(f"{key} holds {value[:40]!r}, not a cluster identity; fix it "
                                           "by hand (docs/decisions.md)")
                return value
            created, _ = await self.store.txn([absent(key)], [Put(key, secrets.token_hex(16).encode())])
            if created:
                continue  # read back what landed rather than trusting the local copy
        raise StoreUnavailable(f"{key} could neither be read nor created")
