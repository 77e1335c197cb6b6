"""What one caller or tenant may hold open on a coordinator replica (coordinator/call_limits.py) and
what all watches together may hold unread (watch_hub.Budget), over a real etcd and a real
coordinator: a call past a limit is refused TOO_MANY_CALLS before anything is read or written; a
slot comes back however its call ends; stalled watch streams pin no more than the budget, and a
stream the budget ended re-lists, missing nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import grpc
import pytest

from holdfast.common import certs, reasons
from holdfast.common.tls import Role
from holdfast.coordinator import keys, records
from holdfast.coordinator.call_limits import CallLimits
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator, run_async, snapshot
from tests.integration.test_watch_hub import wait_until
from tests.integration.txn_harness import Context, Refused

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
BUDGET = 1 << 20  # the least watch_unread_budget_bytes takes


class Peer(Context):
    """A caller at `peer`, with a verified certificate `pem` (None: plaintext)."""

    def __init__(self, pem: bytes | None, peer: str) -> None:
        super().__init__(peer)
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.pem]} if self.pem else {}


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    base = Path(tmp_path_factory.mktemp("pki-call-limits"))
    certs.init_local(base / "ca", [], ["127.0.0.1"])
    return {tenant: certs.issue_one(base / "ca", Role("client", "", tenant), [], base / tenant).read_bytes()
            for tenant in ("team-a", "team-b")}


def put_sessions(coordinator: Coordinator, sids: list[str], size: int = 0) -> None:
    """Session records for `sids`, ~`size` bytes each, 16 to a transaction."""
    made = [pb.SessionRecord(session_id=sid, schema_version=1) for sid in sids]
    for record in made:
        for _ in range(size // 300):
            record.provider_handle_chain.add(handle="h" * 250, minted_at_fence=1)
    put_records(coordinator, made)


def put_records(coordinator: Coordinator, made: list[pb.SessionRecord]) -> None:
    """`made` written as they are, 16 to a transaction."""

    async def write() -> None:
        store = Store.connect(coordinator.etcd_url, prefix=coordinator.prefix)
        try:
            for at in range(0, len(made), 16):
                puts = [Put(keys.session(store, record.session_id), records.encode(record))
                        for record in made[at:at + 16]]
                assert (await store.txn([], puts))[0]
        finally:
            await store.close()

    asyncio.run(write())


def gauges(coordinator: Coordinator, name: str) -> float:
    """The sum of a gauge's series on the coordinator's /metrics."""
    with urllib.request.urlopen(f"http://{coordinator.metrics}/metrics", timeout=10) as page:
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.read().decode().splitlines()
                   if line.startswith(f"{name}{{") or line.startswith(f"{name} "))


def until(what: str, condition: object) -> None:
    asyncio.run(wait_until(condition, what, 20))


@pytest.fixture
def limited(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(etcd.url, tmp_path, prefix, args=(
        "--calls-per-caller-max", "4", "--watch-unread-budget-bytes", str(BUDGET),
        "--metrics-listen", "127.0.0.1:0")).start()
    try:
        yield server
    finally:
        server.stop()


def refused_too_many(call: Iterator[object], setting: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        next(call)
    error = refused.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert reasons.reason_of(error) == reasons.Reason.TOO_MANY_CALLS  # type: ignore[arg-type]
    assert setting in error.details() and "nothing was read or written" in error.details()  # type: ignore[attr-defined]


def test_a_callers_calls_past_its_limit_are_refused_and_every_ending_gives_its_slot_back(
    limited: Coordinator
) -> None:
    """calls_per_caller_max 4, one plaintext caller (its address): four long-lived calls open, the
    fifth — a watch, or an Acquire — is refused TOO_MANY_CALLS, writing nothing. Ended four ways (an
    error, the caller's cancel, its connection closed, its deadline), the four slots come back: four
    open again, and the fifth is refused again."""
    put_sessions(limited, ["limit-seed"])
    now = int(time.time() * 1000)
    reserved = pb.SessionRecord(session_id="limit-waiting", schema_version=1, lease=pb.Lease(
        fence=1, claim_status=pb.RESERVED, reserved_host_id="host-other", reserved_at_unix_ms=now,
        commit_deadline_unix_ms=now + 600_000))
    put_records(limited, [reserved])
    channel, closing = grpc.insecure_channel(limited.address), grpc.insecure_channel(limited.address)
    stub, closing_stub = (coordinator_pb2_grpc.CoordinatorStub(c) for c in (channel, closing))

    try:
        # A Hold waiting (--wait) on another host's reservation: counted while it waits. (Its session
        # lists after limit-seed, each watch's first record.)
        held = stub.Hold(pb.AcquireRequest(session_id="limit-waiting", host_id="host-limit",
                                           operation_id="1" * 32, wait_seconds=120))
        until("the Hold counted", lambda: gauges(limited, "holdfast_streams_open") == 1)
        cancelled = stub.WatchSessions(pb.WatchSessionsRequest())
        lost = closing_stub.WatchSessions(pb.WatchSessionsRequest())
        timed = stub.WatchSessions(pb.WatchSessionsRequest(), timeout=5)
        for watch in (cancelled, lost, timed):
            assert next(watch).record.session_id == "limit-seed"  # the listing: the call is open
        before = snapshot(limited.etcd_url, limited.prefix)
        refused_too_many(stub.WatchSessions(pb.WatchSessionsRequest()), "calls_per_caller_max")
        with pytest.raises(grpc.RpcError) as acquire:
            stub.Acquire(pb.AcquireRequest(session_id="limit-new", host_id="host-limit",
                                           operation_id="0" * 32))
        assert reasons.reason_of(acquire.value) == reasons.Reason.TOO_MANY_CALLS  # type: ignore[arg-type]
        assert snapshot(limited.etcd_url, limited.prefix) == before, "a refusal writes nothing"

        # The reservation put in manual recovery: the waiting Hold decides again and is refused.
        reserved.lease.handoff_stage = pb.MANUAL_RECOVERY
        put_records(limited, [reserved])
        with pytest.raises(grpc.RpcError) as failed:
            next(held)
        assert reasons.reason_of(failed.value) == reasons.Reason.MANUAL_RECOVERY  # type: ignore[arg-type]
        cancelled.cancel()
        closing.close()
        with pytest.raises(grpc.RpcError) as deadline:
            for _ in timed:  # the reservation's change, then its deadline
                pass
        assert deadline.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        until("every call ended at the coordinator", lambda: gauges(limited, "holdfast_streams_open") == 0)

        again = [stub.WatchSessions(pb.WatchSessionsRequest()) for _ in range(4)]
        for watch in again:
            assert next(watch).record.session_id == "limit-seed"
        refused_too_many(stub.WatchSessions(pb.WatchSessionsRequest()), "calls_per_caller_max")
        for watch in again:
            watch.cancel()
    finally:
        channel.close()
        closing.close()


# A client process holding `kind` calls open until it is killed: argv address, kind, count. Each call
# is started (a watch shown its first record) before it says "ready"; it then reads nothing more.
CLIENT = """
import sys
import grpc
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.test_call_limits import start_waiting
stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(sys.argv[1]))
calls = start_waiting(stub, sys.argv[2], int(sys.argv[3]), None)
print("ready", flush=True)
sys.stdin.read()
"""
WAITING_SID = "limit-waiting"
# What the coordinator counts each kind under: a waiting Acquire or Hold is an Acquire waiting on
# the reservation; a WatchSessions is a stream open.
COUNTED = {"Acquire": "holdfast_acquires_waiting", "Hold": "holdfast_acquires_waiting",
           "WatchSessions": "holdfast_streams_open"}


def start_waiting(stub: coordinator_pb2_grpc.CoordinatorStub, kind: str, count: int,
                  timeout: float | None) -> list[grpc.Future]:
    """`count` calls that wait at the coordinator: an Acquire or a Hold with --wait on another host's
    reservation, or a WatchSessions of every session shown its first record and read no further (its
    listing larger than the connection buffers: the coordinator is left writing it)."""
    calls: list[grpc.Future] = []
    for n in range(count):
        if kind == "WatchSessions":
            watch = stub.WatchSessions(pb.WatchSessionsRequest(), timeout=timeout)
            assert next(watch).record.session_id == "limit-seed"
            calls.append(watch)
            continue
        request = pb.AcquireRequest(session_id=WAITING_SID, host_id=f"host-wait-{n}",
                                    operation_id=f"{n:032x}", wait_seconds=600)
        calls.append(stub.Acquire.future(request, timeout=timeout) if kind == "Acquire"
                     else stub.Hold(request, timeout=timeout))
    return calls


def limit_full(coordinator: Coordinator, stub: coordinator_pb2_grpc.CoordinatorStub, kind: str) -> None:
    """The caller's four slots taken by four waiting `kind` calls: counted, and a fifth refused."""
    until(f"four {kind} calls waiting", lambda: gauges(coordinator, COUNTED[kind]) == 4)
    refused_too_many(stub.WatchSessions(pb.WatchSessionsRequest()), "calls_per_caller_max")


def slots_back(coordinator: Coordinator, stub: coordinator_pb2_grpc.CoordinatorStub, how: str) -> None:
    """Every slot given back: four new calls admitted, each retried while refused TOO_MANY_CALLS
    (a refused call takes no slot) for at most 20 s; a fifth refused. Then all four ended, and
    counted ended."""
    deadline, watches = time.monotonic() + 20, []
    while len(watches) < 4:
        watch = stub.WatchSessions(pb.WatchSessionsRequest(session_id="limit-seed"))
        try:
            assert next(watch).record.session_id == "limit-seed"
        except grpc.RpcError as refused:
            assert reasons.reason_of(refused) == reasons.Reason.TOO_MANY_CALLS, refused  # type: ignore[arg-type]
            assert time.monotonic() < deadline, (
                f"a slot was never given back after {how}: {len(watches)} of 4 new calls admitted, "
                f"the next still refused after 20 s: {refused.details()}")  # type: ignore[attr-defined]
            continue
        watches.append(watch)
    refused_too_many(stub.WatchSessions(pb.WatchSessionsRequest()), "calls_per_caller_max")
    for watch in watches:
        watch.cancel()
    until(f"every call ended after {how}", lambda: gauges(coordinator, "holdfast_streams_open") == 0
          and gauges(coordinator, "holdfast_acquires_waiting") == 0)


@pytest.mark.parametrize("kind", ["Acquire", "Hold", "WatchSessions"])
def test_waiting_calls_give_their_slots_back_when_cancelled_killed_or_past_their_deadline(
    limited: Coordinator, kind: str
) -> None:
    """calls_per_caller_max 4, one plaintext caller (its address): four `kind` calls waiting at the
    coordinator fill the caller's limit, ended each way — their client process killed -9 (its
    connection closed by the kernel, nothing said), cancelled by the client, their deadline, and
    for a waiting Acquire or Hold refused by the coordinator mid-wait — and each time four new calls
    are admitted (a slot held on would refuse a call TOO_MANY_CALLS for good), the fifth refused."""
    put_sessions(limited, ["limit-seed"])
    if kind == "WatchSessions":  # ~16 MiB listed: more than a connection buffers for a stalled reader
        put_sessions(limited, [f"limit-stall-{i:04d}" for i in range(1024)], size=16 * 1024)
    now = int(time.time() * 1000)
    reserved = pb.SessionRecord(session_id=WAITING_SID, schema_version=1, lease=pb.Lease(
        fence=1, claim_status=pb.RESERVED, reserved_host_id="host-other", reserved_at_unix_ms=now,
        commit_deadline_unix_ms=now + 600_000))
    put_records(limited, [reserved])
    channel = grpc.insecure_channel(limited.address)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, limited.address, kind, "4"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert client.stdout is not None and client.stdout.readline() == b"ready\n"
        limit_full(limited, stub, kind)
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
        slots_back(limited, stub, "the client process was killed")

        cancelled = start_waiting(stub, kind, 4, None)
        limit_full(limited, stub, kind)
        for call in cancelled:
            call.cancel()
        slots_back(limited, stub, "the client cancelled its calls")

        timed = start_waiting(stub, kind, 4, 5)
        limit_full(limited, stub, kind)
        for call in timed:
            assert call.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[union-attr]
        slots_back(limited, stub, "the calls' deadline passed")

        if kind != "WatchSessions":
            refused = start_waiting(stub, kind, 4, None)
            limit_full(limited, stub, kind)
            # The reservation put in manual recovery: each waiting call decides again and is refused.
            reserved.lease.handoff_stage = pb.MANUAL_RECOVERY
            put_records(limited, [reserved])
            for call in refused:
                assert reasons.reason_of(call.exception()) == reasons.Reason.MANUAL_RECOVERY  # type: ignore[arg-type]
            slots_back(limited, stub, "the coordinator refused them mid-wait")
    finally:
        if client.poll() is None:
            os.kill(client.pid, signal.SIGKILL)
            client.wait(10)
        channel.close()


# Raw HTTP/2 (RFC 9113), for a client no gRPC library would be: streams opened and never sent on.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS = 0x1, 0x3, 0x4
END_HEADERS, ACK = 0x4, 0x1
MAX_CONCURRENT_STREAMS, REFUSED_STREAM = 0x3, 0x7


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_read(frames: BinaryIO) -> tuple[int, int, int, bytes]:
    """The next frame: its type, flags, stream and payload."""
    head = frames.read(9)
    assert len(head) == 9, "the coordinator closed the connection"
    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, frames.read(
        int.from_bytes(head[:3], "big"))


def request_headers(address: str, method: str) -> bytes:
    """A gRPC call's request headers as one HPACK block of literal fields (new names, not indexed)."""
    fields = ((":method", "POST"), (":scheme", "http"), (":path", f"/holdfast.v1.Coordinator/{method}"),
              (":authority", address), ("content-type", "application/grpc"), ("te", "trailers"))
    return b"".join(b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
                    for name, value in fields)


def test_a_connection_holds_at_most_its_callers_calls_and_256_more(limited: Coordinator) -> None:
    """calls_per_caller_max 4: the coordinator's SETTINGS allow a connection 4 + 256 streams. A client
    that opens 300 Acquire streams and never sends a request (none reaches a handler, so no call
    limit counts them; each held ~20 KB of the replica, without end) has the 40 past 260 refused,
    REFUSED_STREAM, and none answered; the same caller on another connection is served, its call
    slots untouched."""
    put_sessions(limited, ["limit-seed"])
    host, port = limited.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock, sock.makefile("rb") as frames:
        sock.sendall(PREFACE + h2_frame(SETTINGS, 0, 0))
        kind, flags, _, payload = h2_read(frames)
        while kind != SETTINGS or flags & ACK:
            kind, flags, _, payload = h2_read(frames)
        settings = {int.from_bytes(payload[at:at + 2], "big"): int.from_bytes(payload[at + 2:at + 6], "big")
                    for at in range(0, len(payload), 6)}
        assert settings.get(MAX_CONCURRENT_STREAMS) == 4 + 256, settings
        sock.sendall(h2_frame(SETTINGS, ACK, 0))  # the limit binds from the client's acknowledgement
        streams = [2 * n + 1 for n in range(300)]
        block = request_headers(limited.address, "Acquire")
        sock.sendall(b"".join(h2_frame(HEADERS, END_HEADERS, stream, block) for stream in streams))
        refused = []
        while len(refused) < 40:
            kind, _, stream, payload = h2_read(frames)
            assert kind != HEADERS, f"stream {stream} answered: it had sent no request"
            if kind == RST_STREAM:
                assert int.from_bytes(payload, "big") == REFUSED_STREAM, payload
                refused.append(stream)
        assert refused == streams[260:]

        channel = grpc.insecure_channel(limited.address)
        try:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            got = stub.GetSession(pb.GetSessionRequest(session_id="limit-seed"), timeout=20)
            assert got.record.session_id == "limit-seed"
            watches = [stub.WatchSessions(pb.WatchSessionsRequest(session_id="limit-seed")) for _ in range(4)]
            for watch in watches:
                assert next(watch).record.session_id == "limit-seed"
            for watch in watches:
                watch.cancel()
        finally:
            channel.close()


@run_async
async def test_a_tenants_callers_together_are_limited_and_another_tenant_is_not(
    etcd: EtcdServer, prefix: str, pems: dict[str, bytes]
) -> None:
    """calls_per_caller_max 2, calls_per_tenant_max 3: team-a's certificate from one address opens
    two, a third there is refused naming the caller's limit; from a second address it opens one more,
    and then the tenant's limit refuses it though that caller has one; team-b opens as before; a call
    ended gives team-a its slot back, and calls all ended give back every slot."""
    service = CoordinatorService(Store(open_channel(etcd.url), prefix), call_limits=CallLimits(2, 3))
    here, there = Peer(pems["team-a"], "ipv4:127.0.0.1:40001"), Peer(pems["team-a"], "ipv4:127.0.0.2:40002")
    other = Peer(pems["team-b"], "ipv4:127.0.0.1:40003")
    revision = (await service.store.snapshot_prefix(prefix))[1]

    async def opened(context: Peer) -> object:
        request = pb.WatchSessionsRequest(session_id="tenant-limit", after_revision=revision)
        call = service.WatchSessions(request, context)
        assert isinstance(await anext(call), pb.SessionEvent)  # type: ignore[call-overload]
        return call

    async def refused(context: Peer, setting: str) -> None:
        with pytest.raises(Refused) as refusal:
            await opened(context)
        assert refusal.value.reason == reasons.Reason.TOO_MANY_CALLS and setting in str(refusal.value)

    try:
        calls = [await opened(here), await opened(here)]
        await refused(here, "calls_per_caller_max")
        calls.append(await opened(there))  # the same certificate elsewhere: another caller
        await refused(there, "calls_per_tenant_max")
        calls.append(await opened(other))
        await calls.pop(0).aclose()  # type: ignore[attr-defined]
        calls.append(await opened(here))  # the slot it gave back
        await refused(there, "calls_per_tenant_max")
        for call in calls:
            await call.aclose()  # type: ignore[attr-defined]
        calls = [await opened(there), await opened(there)]
        for call in calls:
            await call.aclose()  # type: ignore[attr-defined]
    finally:
        await service.store.close()


def test_stalled_watch_streams_pin_no_more_than_the_budget_and_a_stream_it_ended_misses_nothing(
    limited: Coordinator
) -> None:
    """Three WatchSessions streams whose callers read one record and then stop, while ~16 MiB of
    session records are written (each stream's own bound, 16 MiB, would let each hold ~11 MiB of it,
    past what its caller's connection takes: ~33 MB in all):
    what the coordinator holds unread for its watches stays within watch_unread_budget_bytes (1 MiB)
    and one transaction's events. A stalled caller that reads on gets every record, as a change or
    in the listing its stream read again once the budget ended its watch."""
    put_sessions(limited, ["budget-seed"])
    channel = grpc.insecure_channel(limited.address)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    try:
        stalled = [stub.WatchSessions(pb.WatchSessionsRequest()) for _ in range(3)]
        reader = stub.WatchSessions(pb.WatchSessionsRequest())
        for watch in (*stalled, reader):
            assert next(watch).record.session_id == "budget-seed"
        sids = [f"budget-{i:03d}" for i in range(1024)]
        put_sessions(limited, sids, size=16 * 1024)
        put_sessions(limited, ["budget-last"])
        # Every stream's watch is on the coordinator's one etcd stream, whose events come in
        # revision order: the reader having the last record, every watch was given the others.
        seen = set()
        for event in reader:
            seen.add(event.record.session_id)
            if event.record.session_id == "budget-last":
                break
        assert seen >= set(sids)
        unread = gauges(limited, "holdfast_watch_unread_bytes")
        assert unread <= BUDGET + 16 * 17 * 1024, unread
        shown = set()
        for event in stalled[0]:
            shown.add(event.record.session_id)
            if event.record.session_id == "budget-last":
                break
        assert shown >= set(sids), "a stream ended by the budget re-lists: every record is shown"
        for watch in (*stalled, reader):
            watch.cancel()
    finally:
        channel.close()


@run_async
async def test_another_tenants_change_costs_an_all_sessions_watch_nothing(
    etcd: EtcdServer, prefix: str, pems: dict[str, bytes]
) -> None:
    """Twenty team-a WatchSessions of every session, each shown nothing of team-b's: twenty team-b
    changes (and one of team-a's, which every call shows) are each decoded once for the replica,
    and handed to no team-a call, where each call had its own etcd watch and decoded every change
    (~38 µs per open call for every change by any tenant). The calls are served by the replica's
    one watch of the sessions: no watch of their own at etcd."""
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    decoding = service.sessions.decoded
    decodes = 0
    decode = decoding.decode

    def counted(key: str, raw: bytes) -> pb.SessionRecord:
        nonlocal decodes
        decodes += 1
        return decode(key, raw)

    decoding.decode = counted  # type: ignore[method-assign]

    async def put(sid: str, tenant: str) -> None:
        record = pb.SessionRecord(session_id=sid, schema_version=1, tenant=tenant)
        written = Put(keys.session(service.store, sid), records.encode(record))
        assert (await service.store.txn([], [written]))[0]

    # The first call of every session lists nothing and watches on its own, opening the replica's
    # shared watch (its create sent first, so answered before this call's watch has an event).
    first = service.WatchSessions(pb.WatchSessionsRequest(), Peer(None, "ipv4:127.0.0.9:1"))
    shown = asyncio.ensure_future(anext(first))  # type: ignore[call-overload]
    await wait_until(lambda: service.store.watch_creates == 2, "the first call's watch and the shared one")
    await put("amp-ready", "team-a")
    assert (await shown).record.session_id == "amp-ready"
    calls = [service.WatchSessions(pb.WatchSessionsRequest(),
                                   Peer(pems["team-a"], f"ipv4:127.0.0.1:{41000 + i}")) for i in range(20)]
    try:
        listed = await asyncio.gather(*(anext(call) for call in calls))  # type: ignore[call-overload]
        assert {event.record.session_id for event in listed} == {"amp-ready"}
        decodes, handed = 0, service.store.watch_handed
        for i in range(20):
            await put(f"amp-b-{i:02d}", "team-b")
        await put("amp-done", "team-a")
        # Each call now watches from its listing's revision: every change above is its to judge.
        shown = await asyncio.gather(*(anext(call) for call in calls))  # type: ignore[call-overload]
        assert {event.record.session_id for event in shown} == {"amp-done"}
        assert decodes == 21, f"{decodes} decodes for 21 changes seen by {len(calls)} calls"
        assert service.store.watch_handed - handed == 20, "amp-done to each team-a call, nothing else"
        assert service.store.watch_creates == 2, "no call but the first watched on its own"
    finally:
        for call in (first, *calls):
            await call.aclose()  # type: ignore[attr-defined]
        await service.store.close()


@run_async
async def test_a_stream_the_budget_ended_reports_a_record_deleted_before_it_listed_again(
    etcd: EtcdServer, prefix: str
) -> None:
    """A WatchSessions shown two records stalls; one is deleted and the budget ends its watch (the
    deletion dropped with its unread events). Read on, it lists again: the record still there comes
    again, and the deleted one is reported deleted, never left in the caller's view."""
    service = CoordinatorService(Store(open_channel(etcd.url), prefix))
    budget = service.store.watch_budget
    budget.limit = 16 * 1024

    async def put(sid: str, size: int = 0) -> None:
        record = pb.SessionRecord(session_id=sid, schema_version=1)
        for _ in range(size // 300):
            record.provider_handle_chain.add(handle="h" * 250, minted_at_fence=1)
        written = Put(keys.session(service.store, sid), records.encode(record))
        assert (await service.store.txn([], [written]))[0]

    await put("gone")
    await put("kept")
    call = service.WatchSessions(pb.WatchSessionsRequest(), Context())
    try:
        assert [(await anext(call)).record.session_id for _ in range(2)] == ["gone", "kept"]  # type: ignore[call-overload]
        reading = asyncio.ensure_future(anext(call))  # type: ignore[call-overload]
        await put("watched")
        assert (await reading).record.session_id == "watched"  # its watch stands; now it stalls
        await service.store.txn([], [], [keys.session(service.store, "gone")])
        for i in range(3):
            await put(f"large-{i}", size=8 * 1024)
        await wait_until(lambda: budget.shed == 1, "the budget ends the stalled watch")
        events = [await anext(call)]  # type: ignore[call-overload]
        while events[-1].record.session_id != "watched":  # the last listed: ids sort before it
            events.append(await anext(call))  # type: ignore[call-overload]
        assert all(e.resync for e in events) and [e.record.session_id for e in events] == [
            "kept", "large-0", "large-1", "large-2", "watched"]
        await put("zz-last")  # comes on the watch, after anything the re-listing sends
        while events[-1].record.session_id != "zz-last":
            events.append(await anext(call))  # type: ignore[call-overload]
        assert [(e.record.session_id, e.deleted) for e in events[5:]] == [("gone", True), ("zz-last", False)]
    finally:
        await call.aclose()  # type: ignore[attr-defined]
        await service.store.close()
