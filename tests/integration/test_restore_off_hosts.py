"""After an etcd restore, a host that is not registered holds grants closed until it is searched or
shown off since the restore: by a fence's proof (`holdfast admin fence`, which runs while the restore
is pending) or, for a node gone for good, by an all-tenants operator's word (`holdfast admin
recover-host`). Either counts only if written after the restore gate with no registration since,
and restore-epoch compares what it read when it reopens grants. Real etcd, replicas in this
process, a fence agent that logs what it is asked."""

from __future__ import annotations

import pytest

from holdfast.coordinator import keys
from holdfast.coordinator.store import Entry, Put
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.test_fencing_transactions import HOST, fence_by_hand, lost_with_a_reservation, replicas
from tests.integration.txn_harness import TOKEN_ENV, Pair, create, register, writes

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)
SID = "sess-restore-off-1"


async def restore_epoch(p: Pair) -> pb.RestoreEpochResponse:
    request = pb.RestoreEpochRequest(operator="op", reason="restored snap.db")
    return await p.victim.RestoreEpoch(request, p.ctx)  # type: ignore[no-any-return]


async def recover_host(p: Pair) -> pb.RecoverHostResponse:
    request = pb.RecoverHostRequest(host_id=HOST, operator="op", reason="scaled down for good")
    return await p.victim.RecoverHost(request, p.ctx)  # type: ignore[no-any-return]


def unsearched(report: pb.RestoreEpochResponse) -> dict[str, str]:
    return {h.host_id: h.error for h in report.hosts if h.error}


async def restored(p: Pair) -> None:
    """HOST reserved SID and went; then etcd was restored and the gate put, as the runbook says. The
    first restore-epoch cannot search HOST, says which commands count it, and keeps grants closed."""
    await lost_with_a_reservation(p, SID)
    await create(p.other.store, keys.restore_pending(p.other.store), b"restored snap.db")
    report = await restore_epoch(p)
    assert not report.grants_reopened
    hint = unsearched(report)[HOST]
    assert f"holdfast admin fence {HOST}" in hint and f"holdfast admin recover-host {HOST}" in hint


async def reborn(p: Pair) -> None:
    """HOST registers again as a later boot, and goes again."""
    registration = pb.HostRegistration(host_id=HOST, address="127.0.0.1:9", spawn_token_env=TOKEN_ENV,
                                       agent_version="test", incarnation=apb.HostIncarnation(boot_id="next"))
    lease_id, _ = await p.other.registry.register(registration, 60)
    await p.other.store.revoke_lease(lease_id)


async def gate(p: Pair) -> bool:
    return await p.other.store.get(keys.restore_pending(p.other.store)) is not None


@run_async
async def test_an_operators_word_for_a_node_gone_for_good_reopens_grants(etcd: EtcdServer, prefix: str,
                                                                        tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with replicas(etcd, prefix, tmp_path) as p:
        await restored(p)
        assert [r.recovered for r in (await recover_host(p)).results] == [True]
        declared = await p.other.store.get(keys.restore_host_off(p.other.store, HOST))
        assert declared is not None and b"scaled down for good" in declared.value
        report = await restore_epoch(p)
        assert report.grants_reopened and unsearched(report) == {}, report
        assert not await gate(p)
        # The declaration was this restore's: gone with its gate.
        assert await p.other.store.get(keys.restore_host_off(p.other.store, HOST)) is None


@run_async
async def test_a_fence_by_hand_runs_while_a_restore_is_pending_and_its_proof_counts(
        etcd: EtcdServer, prefix: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with replicas(etcd, prefix, tmp_path) as p:
        await restored(p)
        assert (await fence_by_hand(p)).attempt.answer == "off"
        report = await restore_epoch(p)
        assert report.grants_reopened and unsearched(report) == {}, report
        assert not await gate(p)


@run_async
async def test_evidence_from_before_the_restore_or_before_a_registration_does_not_count(
        etcd: EtcdServer, prefix: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with replicas(etcd, prefix, tmp_path) as p:
        await lost_with_a_reservation(p, SID)
        # A proof written before the gate (in the snapshot, or before the restore) says nothing of
        # what ran on HOST since the snapshot.
        assert (await fence_by_hand(p)).attempt.answer == "off"
        await create(p.other.store, keys.restore_pending(p.other.store), b"restored snap.db")
        report = await restore_epoch(p)
        assert HOST in unsearched(report) and not report.grants_reopened
        # Declared off, then HOST registered again (a later incarnation) and went: not covered.
        await recover_host(p)
        await reborn(p)
        report = await restore_epoch(p)
        assert HOST in unsearched(report) and not report.grants_reopened and await gate(p)


@run_async
async def test_grants_reopen_only_if_what_counted_a_host_is_unchanged(etcd: EtcdServer, prefix: str,
                                                                     tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with replicas(etcd, prefix, tmp_path) as p:
        await restored(p)
        await recover_host(p)
        pending = keys.restore_pending(p.store)

        p.store.results.clear()
        p.store.arm(writes(pending), lambda: reborn(p))  # between restore-epoch's reads and its reopening
        report = await restore_epoch(p)
        assert not report.grants_reopened and HOST in unsearched(report)
        # The reopening lost; the gate, still there, is left as the operator put it (not rewritten).
        assert p.store.outcomes_for(pending) == [False, False]
        assert await gate(p)


@run_async
async def test_a_declaration_is_compared_and_needs_a_restore_under_way(etcd: EtcdServer, prefix: str,
                                                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with replicas(etcd, prefix, tmp_path) as p:
        await lost_with_a_reservation(p, SID)
        await recover_host(p)  # no restore under way: the word frees the sessions, and declares nothing
        assert await p.other.store.get(keys.restore_host_off(p.other.store, HOST)) is None
        await create(p.other.store, keys.restore_pending(p.other.store), b"restored snap.db")
        declared = keys.restore_host_off(p.store, HOST)
        p.store.arm(writes(declared), lambda: register(p.other, HOST))
        with pytest.raises(Exception, match="changed while recover-host ran"):
            await recover_host(p)
        assert p.store.outcomes_for(declared) == [False]
        assert await p.other.store.get(declared) is None


async def declared_after_a_gate(p: Pair) -> Entry:
    """HOST reserved SID and went; a restore gate was put, then an operator declared HOST off."""
    await lost_with_a_reservation(p, SID)
    gate_key = keys.restore_pending(p.other.store)
    await create(p.other.store, gate_key, b"restored snap.db")
    await recover_host(p)
    assert await p.other.store.get(keys.restore_host_off(p.other.store, HOST)) is not None
    put = await p.other.store.get(gate_key)
    assert put is not None
    return put


@run_async
async def test_evidence_a_snapshot_kept_from_an_earlier_restore_does_not_count(
        etcd: EtcdServer, prefix: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A backup taken while restore #1 was pending holds its gate and HOST's declaration made after
    # it. Restoring that backup (restore #2) gives back both with their revisions, exactly as they
    # are here; the runbook's put of the gate then dates restore #2. HOST has been neither searched
    # nor shown off since: it may run what restore #2 rolled back. Put over the gate (its create
    # revision kept) or deleted and put afresh, the old declaration must not count.
    async with replicas(etcd, prefix, tmp_path) as p:
        first = await declared_after_a_gate(p)
        gate_key = first.key
        await p.other.store.txn([], [Put(gate_key, b"restored snap2.db")])  # restore #2's step 2
        second = await p.other.store.get(gate_key)
        assert second is not None and second.create_revision == first.create_revision
        report = await restore_epoch(p)
        assert HOST in unsearched(report) and not report.grants_reopened and await gate(p)
        # The runbook's step 2 as it now reads: any gate and declarations gone, then a fresh gate.
        fenced = await fence_by_hand(p)  # a proof from before restore #2 does not count either
        assert fenced.attempt.answer == "off"
        await p.other.store.txn([], [], [gate_key], [keys.restore_host_off_prefix(p.other.store)])
        await create(p.other.store, gate_key, b"restored snap2.db")
        report = await restore_epoch(p)
        assert HOST in unsearched(report) and not report.grants_reopened and await gate(p)


@run_async
async def test_evidence_given_before_an_unfinished_restore_epoch_still_counts(
        etcd: EtcdServer, prefix: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # An unfinished restore-epoch leaves the gate as the operator put it: rewriting it would date the
    # restore after HOST's declaration, and the next run would find HOST unsearched again.
    async with replicas(etcd, prefix, tmp_path) as p:
        put = await declared_after_a_gate(p)
        report = await p.victim.RestoreEpoch(pb.RestoreEpochRequest(
            operator="op", reason="restored", expected_hosts=["node-gone"]), p.ctx)
        assert not report.grants_reopened and set(unsearched(report)) == {"node-gone"}, report
        assert await p.other.store.get(put.key) == put  # not rewritten
        # node-gone is not expected this time: HOST, declared before the first run, still counts.
        assert (await restore_epoch(p)).grants_reopened and not await gate(p)
