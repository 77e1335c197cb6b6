"""Transition history per session: shown by GetSession, capped in etcd."""

from __future__ import annotations

import asyncio
import secrets

import grpc

from holdfast.coordinator.sessions import HISTORY_KEPT
from holdfast.coordinator.store import Store
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]


def test_history_is_capped_and_keeps_the_newest(coordinator: Coordinator, etcd, prefix) -> None:
    coord = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
    # Reserving needs a registered host; no agent is called for a free session or a reserved release.
    reg = pb.HostRegistration(
        host_id="host-hist", address="127.0.0.98:1", spawn_token_env="HOLDFAST_SPAWN_TOKEN"
    )
    coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=60), timeout=10)
    sid = "session-history"
    for _ in range(HISTORY_KEPT // 2 + 5):
        grant = coord.Acquire(
            pb.AcquireRequest(session_id=sid, host_id="host-hist", operation_id=secrets.token_hex(16)),
            timeout=10,
        ).grant
        coord.Release(pb.ReleaseRequest(session_id=sid, fence=grant.fence, secret=grant.secret), timeout=10)
    shown = coord.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10)
    total = 2 * (HISTORY_KEPT // 2 + 5)
    assert shown.record.history_seq == total
    assert [h.seq for h in shown.history] == list(range(total - HISTORY_KEPT + 1, total + 1))
    assert shown.history[-1].transition == "release" and shown.history[-1].fence == grant.fence

    async def stored() -> int:
        store = Store.connect(etcd.url, prefix=prefix)
        try:
            return len((await store.list_prefix(store.key("history", sid, "")))[0])
        finally:
            await store.close()

    assert asyncio.run(stored()) == HISTORY_KEPT
