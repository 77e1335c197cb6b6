"""The carry store over a real etcd (coordinator/carry.py, no gRPC): the cluster-wide budget and the
tenant's are taken before any chunk is stored and refuse a reservation past either with nothing
written, one tenant's full budget leaving another's uploads be; a give-back (archive) returns the
bytes to the tenant and the cluster it charged, exactly, also when the record's tenant or a racing
give-back moved the keys between the read and the write; a commit refuses chunks that do not match
the manifest and keeps the last good copy."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from holdfast.coordinator import fencing, records
from holdfast.coordinator.carry import CarryStore
from holdfast.coordinator.carry_budget_rules import CarryLimits
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel, unchanged
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import agent_pb2
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
        lease=pb.Lease(fence=fence, claim_status=status, grant_secret_hash=fencing.hash_secret(SECRET),
                       owner=agent_pb2.ProcessIdentity(host_id="host-a"))))


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


async def budgets(store: Store) -> dict[str, int]:
    """Every carry budget key's reserved bytes: "" the cluster's, else a tenant's."""
    base = store.key("carry-budget")
    entries, _ = await store.list_prefix(base)
    return {e.key.removeprefix(base).removeprefix("/"): json.loads(e.value)["reserved_bytes"]
            for e in entries}


async def slot_tenant(store: Store, sid: str, slot: int) -> str | None:
    entry = await store.get(store.key("carry", sid, "slot", str(slot)))
    return json.loads(entry.value).get("tenant") if entry is not None else None


@contextlib.asynccontextmanager
async def sharing(etcd: EtcdServer, prefix: str, owners: dict[str, str],
                  default_tenant: str = "default") -> AsyncIterator[CoordinatorService]:
    """A coordinator's service over a cluster budget of 1 MiB and 512 KiB a tenant, and a committed
    owner of each session, its record naming the tenant `owners` gives it."""
    service = CoordinatorService(Store(open_channel(etcd.url), prefix), default_tenant=default_tenant,
                                 carry_limits=CarryLimits(budget=1024 * KIB, tenant_budget=512 * KIB))
    try:
        for sid, tenant in owners.items():
            await owner(service.store, sid, tenant=tenant)
        yield service
    finally:
        await service.store.close()


async def give_back(carried: CarryStore, sid: str) -> None:
    """What an archive does to the session's carried state: deleted, its bytes given back."""
    reads, puts = await carried.discard(sid)
    assert (await carried.store.txn(unchanged(reads), puts, delete_prefixes=[carried.prefix(sid)]))[0]


@run_async
async def test_a_tenant_filling_its_own_budget_is_refused_while_another_still_uploads(
    etcd: EtcdServer, prefix: str
) -> None:
    owners = {"sess-ten-a1": "team-a", "sess-ten-a2": "team-a", "sess-ten-b1": "team-b", "sess-ten-d1": ""}
    async with sharing(etcd, prefix, owners) as service:
        carried, store = service.carried, service.store
        assert await carried.begin(begin("sess-ten-a1", 400 * KIB)) == 0
        before = await everything(store)
        with pytest.raises(CoordinatorError) as refused:
            await carried.begin(begin("sess-ten-a2", 200 * KIB))
        assert refused.value.reason == "CARRY_BUDGET_EXHAUSTED"
        detail = refused.value.message
        assert "tenant team-a" in detail and "carry_tenant_budget_bytes" in detail, detail
        assert await everything(store) == before, "a refused reservation wrote nothing"
        # The cluster has 624 KiB left: tenant b's upload, and the default tenant's (a record
        # naming none), are taken whatever tenant a holds.
        assert await carried.begin(begin("sess-ten-b1", 500 * KIB)) == 0
        assert await carried.begin(begin("sess-ten-d1", 100 * KIB)) == 0
        assert await budgets(store) == {"": 1000 * KIB, "team-a": 400 * KIB, "team-b": 500 * KIB,
                                        "default": 100 * KIB}
        assert await slot_tenant(store, "sess-ten-d1", 0) == "default"
        # Past the cluster's budget, it is the cluster's that is named.
        with pytest.raises(CoordinatorError) as full:
            await carried.begin(begin("sess-ten-a2", 100 * KIB))
        assert full.value.reason == "CARRY_BUDGET_EXHAUSTED" and "the cluster's" in full.value.message


async def archive(service: CoordinatorService, sid: str) -> None:
    """Releases the session's grant (so archiving it needs no probe) and archives it."""
    released = record(sid, 1, "team-a", pb.RELEASED)
    assert (await service.store.txn([], [Put(service.store.key("sessions", sid), released)]))[0]
    await service.lifecycle.archive(
        pb.ArchiveSessionRequest(session_id=sid, expected_fence=1, operator="test", reason="done"))


@run_async
async def test_archive_gives_back_to_the_tenant_and_the_cluster_exactly(
    etcd: EtcdServer, prefix: str
) -> None:
    async with sharing(etcd, prefix, {"sess-arch-a1": "team-a", "sess-arch-a2": "team-a"}) as service:
        carried, store = service.carried, service.store
        assert await carried.begin(begin("sess-arch-a2", 100 * KIB)) == 0
        assert await budgets(store) == {"": 100 * KIB, "team-a": 100 * KIB}
        await carried.begin(begin("sess-arch-a1", 300 * KIB))
        await archive(service, "sess-arch-a1")
        assert await budgets(store) == {"": 100 * KIB, "team-a": 100 * KIB}, "given back to both, exactly"
        assert await carried.begin(begin("sess-arch-a2", 500 * KIB)) == 0, "the tenant's share is free again"


@run_async
async def test_a_copy_given_back_after_its_tenant_changed_leaves_no_bytes_behind(
    etcd: EtcdServer, prefix: str
) -> None:
    """A record naming no tenant is the default tenant's, and the default may be configured anew: a
    slot is given back to the tenant it charged, never to whoever the record names now."""
    sid = "sess-moved-01"
    async with sharing(etcd, prefix, {sid: ""}, default_tenant="team-a") as before:
        assert await before.carried.begin(begin(sid, 300 * KIB)) == 0
        assert await budgets(before.store) == {"": 300 * KIB, "team-a": 300 * KIB}
    async with sharing(etcd, prefix, {}, default_tenant="team-b") as after:
        assert await after.carried.begin(begin(sid, 200 * KIB)) == 0  # the same slot, reserved anew
        assert await budgets(after.store) == {"": 200 * KIB, "team-a": 0, "team-b": 200 * KIB}
        await give_back(after.carried, sid)
        assert await budgets(after.store) == {"": 0, "team-a": 0, "team-b": 0}


def racing(store: Store, move: Callable[[], Awaitable[None]]) -> list[int]:
    """Makes `move` land once, just before the next transaction that writes a carry budget: that
    transaction then finds a key it read changed. The list counts the transactions tried."""
    tried: list[int] = []
    txn = store.txn

    async def raced(compares, puts, deletes=(), delete_prefixes=()):  # type: ignore[no-untyped-def]
        if any("carry-budget" in put.key for put in puts):
            tried.append(1)
            if len(tried) == 1:
                await move()
        return await txn(compares, puts, deletes, delete_prefixes)

    store.txn = raced  # type: ignore[method-assign]
    return tried


@run_async
async def test_a_record_changing_tenant_under_a_reservation_is_read_again(
    etcd: EtcdServer, prefix: str
) -> None:
    sid = "sess-race-t1"
    async with sharing(etcd, prefix, {sid: "team-a"}) as service:
        store = service.store

        async def move() -> None:  # the record now names another tenant (an etcd restored, a hand edit)
            assert (await store.txn([], [Put(store.key("sessions", sid), record(sid, 1, "team-b"))]))[0]

        tried = racing(store, move)
        assert await service.carried.begin(begin(sid, 300 * KIB)) == 0
        assert len(tried) == 2, "the reservation that read team-a lost and was decided again"
        assert await budgets(store) == {"": 300 * KIB, "team-b": 300 * KIB}
        assert await slot_tenant(store, sid, 0) == "team-b"


@run_async
async def test_an_upload_racing_a_give_back_neither_leaks_nor_double_counts(
    etcd: EtcdServer, prefix: str
) -> None:
    async with sharing(etcd, prefix, {"sess-race-g1": "team-a", "sess-race-g2": "team-a"}) as service:
        await service.carried.begin(begin("sess-race-g1", 400 * KIB))

        async def move() -> None:  # g1's archive gives its 400 KiB back between g2's read and write
            await archive(service, "sess-race-g1")

        tried = racing(service.store, move)
        assert await service.carried.begin(begin("sess-race-g2", 100 * KIB)) == 0
        assert len(tried) == 3, "g2's write, the archive's, g2's again on the budgets read anew"
        # Written on its first reading, g2 put back the 400 KiB the archive had just given back.
        assert await budgets(service.store) == {"": 100 * KIB, "team-a": 100 * KIB}


@run_async
async def test_a_copy_reserved_before_tenant_budgets_counts_against_its_tenant_from_its_next_upload(
    etcd: EtcdServer, prefix: str
) -> None:
    """An upgraded cluster: `carry-budget` counts two sessions' copies, no tenant key exists and the
    slots name no tenant. A give-back of such a copy takes from the cluster alone (no tenant key goes
    below what was charged to it); the session's next upload charges its kept copy to its tenant."""
    old = {"sess-old-up": 300 * KIB, "sess-old-idle": 200 * KIB}
    async with sharing(etcd, prefix, dict.fromkeys(old, "team-a")) as service:
        carried, store = service.carried, service.store
        puts = [Put(store.key("carry-budget"), json.dumps({"reserved_bytes": sum(old.values())}).encode())]
        for sid, size in old.items():
            puts += [Put(store.key("carry", sid, "slot", "0"),
                         json.dumps({"fence": 1, "reserved": size, "chunks": 1}).encode()),
                     Put(store.key("carry", sid, "manifest"),
                         records.encode(pb.CarryManifest(session_id=sid, fence=1, slot=0, total_bytes=size)))]
        assert (await store.txn([], puts))[0]
        with pytest.raises(CoordinatorError) as refused:  # 300 KiB kept + 300 KiB new: past team a's 512
            await carried.begin(begin("sess-old-up", 300 * KIB))
        assert refused.value.reason == "CARRY_BUDGET_EXHAUSTED" and "tenant team-a" in refused.value.message
        assert await carried.begin(begin("sess-old-up", 100 * KIB)) == 1
        assert await slot_tenant(store, "sess-old-up", 0) == "team-a", "the kept copy is charged to it"
        assert await budgets(store) == {"": 600 * KIB, "team-a": 400 * KIB}
        await give_back(carried, "sess-old-idle")
        assert await budgets(store) == {"": 400 * KIB, "team-a": 400 * KIB}, "from the cluster alone"
        await give_back(carried, "sess-old-up")
        assert await budgets(store) == {"": 0, "team-a": 0}
