"""Every transaction compares every key its decision read (docs/design.md §3; docs/transactions.md):
against a real etcd, another replica changes one read key between the decision's reads and its
transaction, and the transaction must lose — the caller re-reads and re-decides, or refuses."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator

import pytest

from holdfast.common import spawn_tokens
from holdfast.coordinator.store import Seen, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import (
    Pair,
    Refused,
    acquire,
    archive,
    create,
    delete,
    pair,
    record_of,
    register,
    release,
    touch,
    writes,
)

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
HOST = "host-txn"
Change = Callable[[Pair], Awaitable[None]]


def session_key(p: Pair, sid: str) -> str:
    return p.key("sessions", sid)


async def first_write_lost(p: Pair, sid: str) -> None:
    """The decision's first transaction on the record lost (the change landed between)."""
    outcomes = p.store.outcomes_for(session_key(p, sid))
    assert outcomes and outcomes[0] is False, outcomes


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


# --- grant: record, archive record, new-session floor, restore gate, drain flag, registration ----
GRANT_CHANGES: dict[str, tuple[Change, str]] = {
    # change made between the grant's reads and its transaction → what the retry then does
    "record": (lambda p: touch(p.other.store, p.key("sessions", "sess-grant-row")), "granted"),
    "archive-record": (lambda p: touch(p.other.store, p.key("archive", "sess-grant-row", "record")),
                       "granted"),
    "floor-absent": (lambda p: create(p.other.store, p.key("new-session-floor"), b"7"), "granted"),
    "restore-gate-absent": (lambda p: create(p.other.store, p.key("restore-pending")), "RESTORE_PENDING"),
    "drain-flag-absent": (lambda p: create(p.other.store, p.key("draining", HOST)), "HOST_DRAINING"),
    "registration": (lambda p: touch(p.other.store, p.key("hosts", HOST)), "granted"),
    "registration-gone": (lambda p: delete(p.other.store, p.key("hosts", HOST)), "HOST_NOT_REGISTERED"),
}


@pytest.mark.parametrize("changed", list(GRANT_CHANGES))
@run_async
async def test_grant_loses_to_a_change_of_any_key_it_read(
        etcd: EtcdServer, prefix: str, changed: str) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-grant-row"
        await register(p.other, HOST)
        first = await acquire(p.other, p.ctx, sid, HOST)
        await release(p.other, p.ctx, first.grant)
        if changed != "record":  # the revived-id path reads the archive record and the floor
            await archive(p.other, p.ctx, sid, 1)
        change, then = GRANT_CHANGES[changed]
        p.store.arm(writes(session_key(p, sid)), lambda: change(p))
        if then == "granted":
            got = await acquire(p.victim, p.ctx, sid, HOST)
            assert got.grant.fence == (7 if changed == "floor-absent" else 2)
        else:
            with pytest.raises(Refused) as refused:
                await acquire(p.victim, p.ctx, sid, HOST)
            assert refused.value.reason == then
            record = await record_of(p.other, sid)
            assert record is None or record.lease.fence == 1  # nothing was granted
        await first_write_lost(p, sid)
    finally:
        await p.close()


@pytest.mark.parametrize("meanwhile", ["a drain", "another grant"])
@run_async
async def test_a_first_grant_creates_the_cluster_identity_in_its_own_transaction(
        etcd: EtcdServer, prefix: str, meanwhile: str) -> None:
    """In a keyspace with no identity yet (the coordinator's start-up could not make one), the first
    grant creates it in its own transaction, compared absent: a grant refused after losing its race
    leaves none behind, and one that lost to another grant's identity carries the winner's."""
    p = pair(etcd, prefix)
    try:
        await register(p.other, HOST)
        sid, key = "sess-first-identity", p.key("cluster-id")
        if meanwhile == "a drain":
            p.store.arm(writes(session_key(p, sid)), lambda: create(p.other.store, p.key("draining", HOST)))
            with pytest.raises(Refused) as refused:
                await acquire(p.victim, p.ctx, sid, HOST)
            assert refused.value.reason == "HOST_DRAINING"
            assert await p.other.store.get(key) is None, "a refused grant created the cluster identity"
        else:
            won: list[pb.AcquireResponse] = []

            async def another_grant() -> None:
                won.append(await acquire(p.other, p.ctx, "sess-other-identity", HOST))

            p.store.arm(writes(session_key(p, sid)), another_grant)
            got = await acquire(p.victim, p.ctx, sid, HOST)
            stored = await p.other.store.get(key)
            assert stored is not None
            assert got.grant.cluster_id == won[0].grant.cluster_id == stored.value.decode()
        await first_write_lost(p, sid)
    finally:
        await p.close()


@run_async
async def test_an_operation_granted_meanwhile_is_replayed_not_granted_twice(
        etcd: EtcdServer, prefix: str) -> None:
    """The grant compares this operation's replay key, read absent, with the record. When the same
    operation is granted on another replica between the reads and the transaction (a retry racing
    its first try), the transaction loses, and the re-read finds the replay: the caller gets that
    grant, at the same fence with the same secret — one grant, not a refusal and not a second."""
    p = pair(etcd, prefix)
    try:
        sid = "sess-replay-race"
        operation = secrets.token_hex(16)
        await register(p.other, HOST)
        elsewhere: list[pb.AcquireResponse] = []

        async def same_operation_on_the_other_replica() -> None:
            elsewhere.append(await acquire(p.other, p.ctx, sid, HOST, operation_id=operation))

        p.store.arm(writes(session_key(p, sid)), same_operation_on_the_other_replica)
        got = await acquire(p.victim, p.ctx, sid, HOST, operation_id=operation)
        assert [e.grant.fence for e in elsewhere] == [1]
        assert got.grant.fence == 1 and got.grant.secret == elsewhere[0].grant.secret
        record = await record_of(p.other, sid)
        assert record is not None and record.lease.fence == 1
        await first_write_lost(p, sid)
    finally:
        await p.close()


# --- transitions without an agent: release of a reservation, handoff request, archive, recover-host
@run_async
async def test_release_handoff_and_archive_lose_to_a_change_of_the_record(
        etcd: EtcdServer, prefix: str) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-record-rows"
        await register(p.other, HOST)
        got = await acquire(p.other, p.ctx, sid, HOST)
        touch_record = lambda: touch(p.other.store, session_key(p, sid))  # noqa: E731
        p.store.arm(writes(session_key(p, sid)), touch_record)
        with pytest.raises(Refused) as refused:
            await release(p.victim, p.ctx, got.grant)
        assert refused.value.reason == "STALE_FENCE"
        assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]

        p.store.results.clear()
        p.store.arm(writes(session_key(p, sid)), touch_record)
        handoff = pb.RequestHandoffRequest(session_id=sid, operation_id=secrets.token_hex(16), host_id=HOST)
        done = await p.victim.RequestHandoff(handoff, p.ctx)  # re-reads and asks again: it loops
        assert done.record.lease.handoff_stage == pb.HANDOFF_REQUESTED  # type: ignore[attr-defined]
        assert p.store.outcomes_for(session_key(p, sid)) == [False, True]

        await release(p.other, p.ctx, got.grant)
        p.store.results.clear()
        p.store.arm(writes(session_key(p, sid)), touch_record)
        with pytest.raises(Refused) as refused:
            await archive(p.victim, p.ctx, sid, 1)
        assert refused.value.reason == "STALE_FENCE"
        await first_write_lost(p, sid)
        assert await p.other.store.get(p.key("archive", sid, "record")) is None
    finally:
        await p.close()


@run_async
async def test_recover_host_compares_the_host_absent_in_each_sessions_transaction(
        etcd: EtcdServer, prefix: str) -> None:
    p = pair(etcd, prefix)
    try:
        lease_id = await register(p.other, HOST)
        sids = ["sess-gone-host-1", "sess-gone-host-2"]
        for sid in sids:
            await acquire(p.other, p.ctx, sid, HOST)  # reservations on the host: claimed there
        await p.other.store.revoke_lease(lease_id)  # its registration is gone

        async def comes_back() -> None:
            await register(p.other, HOST)  # the host's agent registers again meanwhile

        p.store.arm(writes(session_key(p, sids[0])), comes_back)
        request = pb.RecoverHostRequest(host_id=HOST, operator="test", reason="node gone")
        response = await p.victim.RecoverHost(request, p.ctx)
        assert [r.recovered for r in response.results] == [False, False]  # type: ignore[attr-defined]
        for sid in sids:
            assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]
    finally:
        await p.close()


@run_async
async def test_restore_epoch_raises_the_new_session_floor_by_a_compared_read_modify_write(
        etcd: EtcdServer, prefix: str) -> None:
    p = pair(etcd, prefix)
    try:
        floor = p.key("new-session-floor")
        p.store.arm(writes(floor), lambda: create(p.other.store, floor, b"100"))
        request = pb.RestoreEpochRequest(operator="test", reason="restored", epoch=10)
        await p.victim.RestoreEpoch(request, p.ctx)
        assert p.store.outcomes_for(floor) == [False, True]
        entry = await p.other.store.get(floor)
        assert entry is not None and int(entry.value) == 110  # the concurrent raise is kept
    finally:
        await p.close()


# --- transitions that need the owner host's real agent: commit, drain, force-pending, release ----
AGENT_HOST = "host-local"
TAKER = "host-taker"


@pytest.fixture
def local_agent(tmp_path) -> Iterator[AgentProcess]:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("the agent scans every process: root")
    agent = AgentProcess(tmp_path, AGENT_HOST)
    yield agent
    agent.stop()


@pytest.fixture
def owners() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Owner processes (plain `sleep`s carrying a token) this test started; killed by pid after."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)


async def reserve_on_agent(p: Pair, agent: AgentProcess, sid: str,
                           owners: list[subprocess.Popen[bytes]]) -> tuple[pb.Grant, int]:
    """The agent registered, a grant for its host and a process carrying the grant's token."""
    info = agent.stub.GetHostInfo(apb.GetHostInfoRequest(), timeout=5)
    reg = pb.HostRegistration(host_id=AGENT_HOST, address=agent.address, incarnation=info.incarnation,
                              spawn_token_env=info.spawn_token_env, agent_version="test")
    await p.other.registry.register(reg, 60)
    grant = (await acquire(p.other, p.ctx, sid, AGENT_HOST, live_on_commit=True)).grant
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, grant.spawn_token_env: grant.spawn_token})
    owners.append(proc)
    return grant, proc.pid


def commit_request(grant: pb.Grant, pid: int) -> pb.CommitOwnerRequest:
    return pb.CommitOwnerRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                 pid_hint=pid)


async def owned_with_a_taker(p: Pair, agent: AgentProcess, sid: str,
                             owners: list[subprocess.Popen[bytes]]) -> int:
    """A committed owner of `sid` on the agent's host, and TAKER registered; the owner's pid."""
    grant, pid = await reserve_on_agent(p, agent, sid, owners)
    await p.other.CommitOwner(commit_request(grant, pid), p.ctx)
    await register(p.other, TAKER)
    return pid


@pytest.mark.parametrize("changed", ["record", "registration", "draining"])
@run_async
async def test_commit_loses_to_a_change_of_the_record_or_the_reserved_hosts_gates(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list, changed: str) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-commit-row"
        grant, pid = await reserve_on_agent(p, local_agent, sid, owners)
        changes = {"record": lambda: touch(p.other.store, session_key(p, sid)),
                   "registration": lambda: touch(p.other.store, p.key("hosts", AGENT_HOST)),
                   # the drain flag, set after the commit read the gates open
                   "draining": lambda: create(p.other.store, p.key("draining", AGENT_HOST))}
        p.store.arm(writes(session_key(p, sid)), changes[changed])
        with pytest.raises(Refused) as refused:
            await p.victim.CommitOwner(commit_request(grant, pid), p.ctx)
        assert refused.value.reason == "STALE_FENCE"
        await first_write_lost(p, sid)
        assert (await record_of(p.other, sid)).lease.claim_status == pb.RESERVED  # type: ignore[union-attr]
    finally:
        await p.close()


@run_async
async def test_drains_handoff_request_loses_to_an_undo_of_the_drain(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-drain-row"
        grant, pid = await reserve_on_agent(p, local_agent, sid, owners)
        await p.other.CommitOwner(commit_request(grant, pid), p.ctx)
        p.store.arm(writes(session_key(p, sid)), lambda: delete(p.other.store, p.key("draining", AGENT_HOST)))
        response = await p.victim.DrainHost(pb.DrainHostRequest(host_id=AGENT_HOST, draining=True,
                                                                operator="test"), p.ctx)
        assert [s.split(":")[0] for s in response.skipped] == [sid]  # type: ignore[attr-defined]
        await first_write_lost(p, sid)
        assert (await record_of(p.other, sid)).lease.handoff_stage == pb.NONE  # type: ignore[union-attr]
    finally:
        await p.close()


GATE_CLOSINGS: dict[str, tuple[Callable[[Pair], str], Callable[[Store, str], Awaitable[None]], str]] = {
    # a gate of the grant closed by another replica after it was read: the key, how another
    # replica's store closes it there, and the refusal
    "drain-flag-absent": (lambda p: p.key("draining", TAKER), create, "HOST_DRAINING"),
    "restore-gate-absent": (lambda p: p.key("restore-pending"), create, "RESTORE_PENDING"),
    "registration-gone": (lambda p: p.key("hosts", TAKER), delete, "HOST_NOT_REGISTERED"),
}


@pytest.mark.parametrize("how", ["ask", "force"])
@pytest.mark.parametrize("changed", list(GATE_CLOSINGS))
@run_async
async def test_a_takeover_loses_to_a_changed_precondition_and_neither_asks_nor_kills(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list, changed: str,
        how: str) -> None:
    """The demonstrated window of docs/design.md §5: a drain (or a restore gate, or the taker's
    registration gone) between the check and the write must not get the owner asked to let go (a
    takeover's own request) nor killed (force-pending, after the request the record holds)."""
    p = pair(etcd, prefix)
    try:
        sid = f"sess-{how}-row"
        await owned_with_a_taker(p, local_agent, sid, owners)
        op = secrets.token_hex(16)
        if how == "force":
            await p.other.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id=op,
                                                                  host_id=TAKER), p.ctx)
        before = await record_of(p.other, sid)
        key_of, close, then = GATE_CLOSINGS[changed]
        key = key_of(p)
        p.store.arm(writes(session_key(p, sid)), lambda: close(p.other.store, key))
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, p.ctx, sid, TAKER, operation_id=op, takeover=True, force=how == "force")
        assert refused.value.reason == then
        await first_write_lost(p, sid)
        assert owners[0].poll() is None, "the owner was killed for a refused takeover"
        assert await record_of(p.other, sid) == before, "a refused takeover changed the record"
    finally:
        await p.close()


@run_async
async def test_an_exit_events_early_probe_proves_nothing_about_another_owner(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list) -> None:
    """After an owner's exit event a waiting Acquire has that owner's proof (the event's) with its
    re-read. When the re-read record names another owner (another replica granted it meanwhile),
    that proof is not used: the waiting Acquire is refused while the new owner lives, never
    granted over it."""
    p = pair(etcd, prefix)
    try:
        sid = "sess-early-probe"
        first = await owned_with_a_taker(p, local_agent, sid, owners)
        seconds: list[int] = []
        waiting_on_first = asyncio.Event()
        wait_exit = p.victim.router.wait_exit

        async def then_another_owner(owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                                     timeout: float) -> apb.ProbeResult | None:
            if owner.pid != first:
                return await wait_exit(owner, reg, timeout)
            waiting_on_first.set()
            exited = await wait_exit(owner, reg, timeout)  # the first owner's proof, tree and all
            assert exited is not None and exited.tree_gone
            # The first owner's exit was seen: another replica grants the session to a second.
            again = (await acquire(p.other, p.ctx, sid, AGENT_HOST, live_on_commit=True)).grant
            owners.append(subprocess.Popen(["sleep", "300"],
                                           env={**os.environ, again.spawn_token_env: again.spawn_token}))
            await p.other.CommitOwner(commit_request(again, owners[-1].pid), p.ctx)
            seconds.append(owners[-1].pid)
            return exited

        p.victim.router.wait_exit = then_another_owner  # type: ignore[method-assign]
        waiting = asyncio.create_task(acquire(p.victim, p.ctx, sid, TAKER, wait_seconds=2))
        await waiting_on_first.wait()
        os.kill(first, signal.SIGKILL)
        owners[0].wait(5)
        with pytest.raises(Refused) as refused:
            await waiting
        assert refused.value.reason == "HELD", "granted over a live owner on the first owner's proof"
        record = await record_of(p.other, sid)
        assert record is not None and record.lease.fence == 2 and record.lease.owner.pid == seconds[0]
    finally:
        await p.close()


@pytest.mark.parametrize("how", ["wait", "takeover"])
@pytest.mark.parametrize("changed", list(GATE_CLOSINGS))
@run_async
async def test_a_grant_on_the_reads_held_over_a_wait_loses_to_a_change_of_any(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list, changed: str,
        how: str) -> None:
    """After the owner's exit event proved its tree gone, a waiting Acquire (`--wait`, or a takeover
    that asked) grants on the reads its wait began on, without reading again. A gate that closed
    during the wait makes that grant's transaction lose; decided again on a fresh read, the Acquire
    is refused with the gate's reason and nothing is granted."""
    p = pair(etcd, prefix)
    try:
        sid = f"sess-held-{how}"
        first = await owned_with_a_taker(p, local_agent, sid, owners)
        key_of, close, then = GATE_CLOSINGS[changed]
        key = key_of(p)
        waiting_on_first = asyncio.Event()
        wait_exit = p.victim.router.wait_exit

        async def then_a_gate_closes(owner: apb.ProcessIdentity, reg: pb.HostRegistration | None,
                                     timeout: float) -> apb.ProbeResult | None:
            waiting_on_first.set()
            exited = await wait_exit(owner, reg, timeout)
            assert exited is not None and exited.tree_gone
            await close(p.other.store, key)
            return exited

        p.victim.router.wait_exit = then_a_gate_closes  # type: ignore[method-assign]
        waiting = asyncio.create_task(acquire(p.victim, p.ctx, sid, TAKER, wait_seconds=20,
                                              takeover=how == "takeover"))
        await waiting_on_first.wait()
        os.kill(first, signal.SIGKILL)
        owners[0].wait(5)
        with pytest.raises(Refused) as refused:
            await waiting
        assert refused.value.reason == then
        written = p.store.outcomes_for(session_key(p, sid))
        assert written[-1] is False, "the grant did not rest on the reads held over the wait"
        record = await record_of(p.other, sid)
        assert record is not None and record.lease.fence == 1 and record.lease.owner.pid == first
    finally:
        await p.close()


@pytest.mark.parametrize("gated", [False, True])
@run_async
async def test_a_grant_compares_both_readings_of_a_registration_it_read_twice(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list, gated: bool) -> None:
    """The taker's host is the dead owner's: the grant reads that host's registration as its gate,
    then again for the probe. Rewritten between the two readings (by the agent re-registering, here
    another replica), the grant's transaction compares both and loses; decided again on one reading,
    a gate attested under the first is not committed as the owner (a reservation instead)."""
    p = pair(etcd, prefix)
    try:
        sid = f"sess-read-twice-{gated}"
        grant, pid = await reserve_on_agent(p, local_agent, sid, owners)
        await p.other.CommitOwner(commit_request(grant, pid), p.ctx)
        os.kill(pid, signal.SIGKILL)
        owners[0].wait(5)
        gate = None
        if gated:
            secret = spawn_tokens.mint_spawn_secret()
            owners.append(subprocess.Popen(["sleep", "300"], env={
                **os.environ, grant.spawn_token_env: spawn_tokens.spawn_token_for(secret)}))
            gate = pb.GateSpawn(pid_hint=owners[-1].pid, token_secret=secret,
                                spawn_token_env=grant.spawn_token_env)
        probe = p.victim.sessions.probe
        rewritten: list[bool] = []

        async def after_a_reregistration(owner: apb.ProcessIdentity,
                                         kill: bool = False) -> tuple[apb.ProbeResult, Seen]:
            if not rewritten:
                rewritten.append(True)
                await touch(p.other.store, p.key("hosts", AGENT_HOST))
            return await probe(owner, kill)

        p.victim.sessions.probe = after_a_reregistration  # type: ignore[method-assign]
        got = await acquire(p.victim, p.ctx, sid, AGENT_HOST, gate=gate)
        assert rewritten
        await first_write_lost(p, sid)
        assert got.grant.fence == 2
        assert got.record.lease.claim_status == pb.RESERVED and got.record.lease.owner.pid == 0, \
            "committed under a registration the grant did not compare"
    finally:
        await p.close()


@run_async
async def test_release_loses_to_a_change_of_the_owner_hosts_registration(
        etcd: EtcdServer, prefix: str, local_agent: AgentProcess, owners: list) -> None:
    p = pair(etcd, prefix)
    try:
        sid = "sess-release-row"
        grant, pid = await reserve_on_agent(p, local_agent, sid, owners)
        await p.other.CommitOwner(commit_request(grant, pid), p.ctx)
        os.kill(pid, signal.SIGKILL)
        owners[0].wait(5)
        p.store.arm(writes(session_key(p, sid)), lambda: touch(p.other.store, p.key("hosts", AGENT_HOST)))
        with pytest.raises(Refused) as refused:
            await release(p.victim, p.ctx, grant)
        assert refused.value.reason == "STALE_FENCE"
        await first_write_lost(p, sid)
        released = await release(p.victim, p.ctx, grant)  # asked again, on an unchanged registration
        assert released.record.lease.claim_status == pb.RELEASED
    finally:
        await p.close()
