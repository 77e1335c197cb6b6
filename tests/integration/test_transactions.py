"""Every transaction compares every key its decision read (DESIGN.md §3; docs/transactions.md):
against a real etcd, another replica changes one read key between the decision's reads and its
transaction, and the transaction must lose — the caller re-reads and re-decides, or refuses."""

from __future__ import annotations

import pytest

from holdfast.coordinator.etcd_server import EtcdServer
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import acquire, archive, pair, record_of, register, release, writes

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
HOST = "host-txn"


@run_async
async def test_archive_then_two_acquires_on_the_revived_id_never_share_a_fence(
        etcd: EtcdServer, prefix: str) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-revive-race"
        await register(p.other, HOST)
        first = await acquire(p.other, p.ctx, sid, HOST)
        await release(p.other, p.ctx, first.grant)
        await archive(p.other, p.ctx, sid, 1)
        taken: list[int] = []

        async def the_other_acquire() -> None:
            # B has read "no record" and the archive at fence 1; A revives the id at fence 2, lets
            # it go and archives it again, so the record is absent once more when B writes.
            a = await acquire(p.other, p.ctx, sid, HOST)
            taken.append(a.grant.fence)
            await release(p.other, p.ctx, a.grant)
            await archive(p.other, p.ctx, sid, a.grant.fence)

        p.store.arm(writes(p.key("sessions", sid)), the_other_acquire)
        b = await acquire(p.victim, p.ctx, sid, HOST)
        assert taken == [2]
        assert p.store.outcomes_for(p.key("sessions", sid))[0] is False  # B's first write lost
        assert b.grant.fence == 3, "one fence granted twice"
        record = await record_of(p.other, sid)
        assert record is not None and record.lease.fence == 3
    finally:
        await p.close()
