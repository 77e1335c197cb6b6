"""Replay memory of Acquire operations: one `ops/<session>/<hash>` key per grant, bound to a lease.

Guarantee: a retried Acquire (same caller, same operation id) gets its grant back while that grant
is the session's current one, and STALE_FENCE after it, for at least REMEMBER_S after the grant. The
key then lapses with its lease: before, every Acquire ever made left a key of ~1 KB for good, so a
busy session grew etcd without bound toward its quota, where etcd refuses every write, heartbeats
included (docs/benchmarks.md, *Scale*). A retry later than that is a new request, adjudicated like
any other, so forgetting grants nothing a fresh Acquire could not get.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from holdfast.coordinator.store import Store

REMEMBER_S = 3600


class ReplayLease:
    """The lease replay keys are bound to: one per coordinator, replaced every REMEMBER_S and living
    twice that, so a key lives between REMEMBER_S and twice REMEMBER_S (one lease grant an hour)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lease = 0
        self._since = 0.0
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return bool(self._lease) and time.monotonic() - self._since < REMEMBER_S

    async def current(self) -> int:
        if self._fresh():
            return self._lease
        async with self._lock:
            if not self._fresh():
                self._lease = await self.store.grant_lease(2 * REMEMBER_S)
                self._since = time.monotonic()
            return self._lease

    def lost(self, exc: grpc.aio.AioRpcError, lease: int) -> bool:
        """Whether a transaction failed because `lease` is gone (etcd restored from an older
        backup, or revoked by hand): then it is forgotten, and the caller retries with a new one."""
        if exc.code() is not grpc.StatusCode.NOT_FOUND or "lease not found" not in (exc.details() or ""):
            return False
        if self._lease == lease:
            self._lease = 0
        return True
