"""Keepalive (holdfast.common.keepalive): a watch whose coordinator goes silent without a TCP reset
fails within the keepalive interval plus its ping's timeout, and reconnects as it does on any
UNAVAILABLE; so `holdfast run`, its link silenced, still hears a takeover's handoff request. A
client pinging at the interval is not sent GOAWAY too_many_pings by a coordinator set alike (and is,
by one set far higher: the policy is what keeps it). Real etcd, coordinator, agents and `run`
processes; a loopback proxy silences the link and reads the HTTP/2 frames that cross it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.common import keepalive, serving
from holdfast.coordinator import records
from holdfast.coordinator.store import Put, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.faults.proxy import FaultProxy, ProxyLoop
from tests.integration.coordinator_fixtures import Coordinator, run_async
from tests.integration.run_fixtures import Cluster, Run, until
from tests.integration.test_owner_hold import started as child_started
from tests.integration.test_owner_hold import streams_open, taken_over

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = pytest.mark.timeout(120)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # a client's first bytes, before any frame
PING, GOAWAY, ACK = 0x6, 0x7, 0x1
INTERVAL = 1  # seconds: the keepalive the tests lower every party to


class Frames:
    """The PING and GOAWAY frames crossing a plaintext HTTP/2 proxy: (connection, direction, type,
    flags, payload), "down" being the coordinator's."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, int, int, bytes]] = []
        self._buffers: dict[tuple[int, str], bytearray] = {}
        self._changed = threading.Condition()

    def __call__(self, number: int, direction: str, chunk: bytes) -> None:
        buffer = self._buffers.setdefault((number, direction), bytearray())
        buffer += chunk
        if direction == "up" and buffer.startswith(PREFACE):
            del buffer[:len(PREFACE)]
        with self._changed:
            while len(buffer) >= 9 and len(buffer) >= 9 + (length := int.from_bytes(buffer[:3], "big")):
                kind, flags, payload = buffer[3], buffer[4], bytes(buffer[9:9 + length])
                del buffer[:9 + length]
                if kind in (PING, GOAWAY):
                    self.seen.append((number, direction, kind, flags, payload))
            self._changed.notify_all()

    def acks(self, number: int) -> int:
        """The client's pings on connection `number` the coordinator acknowledged."""
        return sum(1 for n, d, kind, flags, _ in self.seen if (n, d, kind) == (number, "down", PING)
                   and flags & ACK)

    def goaways(self) -> list[bytes]:
        return [payload for _, d, kind, _, payload in self.seen if (d, kind) == ("down", GOAWAY)]

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
        with self._changed:
            if not self._changed.wait_for(done, timeout):
                raise AssertionError(f"no {what} within {timeout}s; frames: {self.seen}")


@pytest.fixture
def proxies() -> Iterator[ProxyLoop]:
    loop = ProxyLoop()
    try:
        yield loop
    finally:
        loop.close()


def started(etcd: EtcdServer, tmp_path: Path, prefix: str, seconds: int, *args: str) -> Coordinator:
    return Coordinator(etcd.url, tmp_path, prefix, args=("--metrics-listen", "127.0.0.1:0", *args),
                       env={keepalive.ENV: str(seconds)}).start()


@pytest.fixture
def coordinator(etcd: EtcdServer, tmp_path: Path, prefix: str,
                request: pytest.FixtureRequest) -> Iterator[Coordinator]:
    """Its keepalive INTERVAL, unless a test asks (indirectly) for (seconds, *flags)."""
    seconds, *args = getattr(request, "param", (INTERVAL,))
    server = started(etcd, tmp_path, prefix, seconds, *args)
    try:
        yield server
    finally:
        server.stop()


async def put_record(etcd: EtcdServer, prefix: str, sid: str, fence: int) -> None:
    store = Store.connect(etcd.url, prefix=prefix)
    try:
        record = pb.SessionRecord(schema_version=records.SCHEMA_VERSION, session_id=sid,
                                  lease=pb.Lease(fence=fence, claim_status=pb.RELEASED))
        assert (await store.txn([], [Put(store.key("sessions", sid), records.encode(record))]))[0]
    finally:
        await store.close()


@dataclass
class Watch:
    """A session's watch (`session_events`) through a proxy in front of a coordinator."""

    proxy: FaultProxy
    frames: Frames
    events: AsyncIterator[pb.SessionEvent]
    lost: list[tuple[float, ClientError]]  # when each outage was reported, and how


@contextlib.asynccontextmanager
async def watching(etcd: EtcdServer, tmp_path: Path, prefix: str, proxies: ProxyLoop,
                   server_seconds: int, sid: str) -> AsyncIterator[Watch]:
    """Its first event (the record at fence 1, listed) already read."""
    coordinator = started(etcd, tmp_path, prefix, server_seconds)
    try:
        await put_record(etcd, prefix, sid, 1)
        proxy = proxies.add("coordinator", coordinator.address)
        frames = Frames()
        proxy.observe = frames
        lost: list[tuple[float, ClientError]] = []
        async with Client(proxy.address, host_id="host-a") as client:
            events = client.session_events(sid, lost=lambda err: lost.append((time.monotonic(), err)))
            assert (await anext(events)).record.lease.fence == 1
            yield Watch(proxy, frames, events, lost)
    finally:
        coordinator.stop()


@run_async
async def test_a_watch_through_a_silenced_link_fails_within_keepalive_and_reconnects(
        etcd: EtcdServer, tmp_path: Path, prefix: str, proxies: ProxyLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))
    async with watching(etcd, tmp_path, prefix, proxies, INTERVAL, "sess-keepalive-silenced") as watch:
        # Past gRPC's default of two pings without data: an idle watch keeps being pinged.
        await asyncio.to_thread(watch.frames.wait, "three acknowledged pings",
                                lambda: watch.frames.acks(0) >= 3)
        proxies.stall(watch.proxy)  # the link goes silent both ways; nothing is closed
        silenced = time.monotonic()
        again = await anext(watch.events)  # the listing of the call that reconnected over a new link
        assert not watch.frames.goaways()  # the coordinator's own (its shutdown's) come after
    assert again.resync and again.record.lease.fence == 1
    assert len(watch.lost) == 1, watch.lost
    took = watch.lost[0][0] - silenced
    bound = INTERVAL + keepalive.ack_timeout(INTERVAL)
    assert took <= bound + 2.0, f"the silenced call failed after {took:.1f}s, bound {bound}s"


@run_async
async def test_a_connection_past_its_maximum_age_is_closed_and_its_watch_reconnects(
        etcd: EtcdServer, tmp_path: Path, prefix: str, proxies: ProxyLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keepalive would hold the watch's connection open for ever, and with it whatever its
    certificate was at the handshake: the coordinator sends GOAWAY max_age, ends the call after the
    grace, and the watch lists again over a new connection (a new handshake)."""
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))
    monkeypatch.setenv(serving.MAX_AGE_ENV, "2")  # the coordinator's, from this environment
    monkeypatch.setenv(serving.MAX_AGE_GRACE_ENV, "1")
    async with watching(etcd, tmp_path, prefix, proxies, INTERVAL, "sess-max-age") as watch:
        again = await anext(watch.events)  # the listing of the call that reconnected
        goaways = watch.frames.goaways()
        connections = {n for n, *_ in watch.frames.seen}
    assert again.resync and again.record.lease.fence == 1
    assert any(b"max_age" in payload for payload in goaways), goaways
    assert len(watch.lost) == 1, watch.lost
    assert connections == {0, 1}, connections  # the aged connection, then the watch's new one


@pytest.mark.parametrize("server_seconds", [INTERVAL, keepalive.DEFAULT_SECONDS])
@run_async
async def test_pings_at_the_interval_are_accepted_by_a_coordinator_set_alike(
        etcd: EtcdServer, tmp_path: Path, prefix: str, proxies: ProxyLoop, monkeypatch: pytest.MonkeyPatch,
        server_seconds: int) -> None:
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))
    sid = "sess-keepalive-pings"
    async with watching(etcd, tmp_path, prefix, proxies, server_seconds, sid) as watch:
        frames = watch.frames
        if server_seconds > INTERVAL:
            # The control: a policy of half of 20 s strikes each 1 s ping; the third costs the call.
            await asyncio.to_thread(frames.wait, "GOAWAY", lambda: bool(frames.goaways()))
            assert b"too_many_pings" in frames.goaways()[0]
            assert (await anext(watch.events)).resync  # it reconnected, as on any UNAVAILABLE
            assert len(watch.lost) == 1
            return
        # Four pings, one past the two strikes gRPC forgives: a refused rate would be GOAWAY by now.
        await asyncio.to_thread(frames.wait, "four acknowledged pings", lambda: frames.acks(0) >= 4)
        await put_record(etcd, prefix, sid, 2)
        changed = await anext(watch.events)
        assert not watch.lost and not frames.goaways()  # the coordinator's own (its shutdown's) come after
        assert {n for n, *_ in frames.seen} == {0}  # one connection throughout
    assert changed.record.lease.fence == 2 and not changed.resync  # on the same call


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")
def test_an_owner_whose_link_went_silent_still_hears_a_takeover(
        cluster: Cluster, proxies: ProxyLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))  # the agents' and the runs'
    a, b = cluster.host("host-a"), cluster.host("host-b")
    proxy = proxies.add("coordinator", cluster.coordinator.address)
    sid = "sess-keepalive-hold"
    first = cluster.run(a, sid, "--grace", "5", env={"HOLDFAST_COORDINATOR": proxy.address})
    child_started(cluster, 1)
    assert streams_open(cluster.coordinator) == {"Hold": 1.0}
    proxies.stall(proxy)
    # The owner's Hold call fails (its pings unanswered) and its watch goes on as a WatchSessions
    # over a new link; the coordinator's side of the silenced call ends by its own pings.
    watches_again_and_hears_a_takeover(cluster, first, b, sid)


def watches_again_and_hears_a_takeover(cluster: Cluster, first: Run, host: SimulatedHost, sid: str) -> None:
    """`first`, its Hold ended under it, watches on a WatchSessions and still ends for a takeover."""
    until("the owner's watch back, as a WatchSessions",
          lambda: streams_open(cluster.coordinator) == {"WatchSessions": 1.0})
    assert first.proc.poll() is None

    second = taken_over(cluster, first, host, sid)
    os.kill(second.run_pid, signal.SIGTERM)
    assert second.wait(30) == 0


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")
def test_an_owners_hold_ended_by_its_connections_maximum_age_goes_on_as_a_watch_and_hears_a_takeover(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))  # the agents' and the runs'
    monkeypatch.setenv(serving.MAX_AGE_ENV, "2")  # every server's: the coordinator's and the agents'
    monkeypatch.setenv(serving.MAX_AGE_GRACE_ENV, "1")
    cluster.coordinator.stop()  # started by the fixture before the setting: again, with it
    cluster.coordinator.start()
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-max-age-hold"
    first = cluster.run(a, sid, "--grace", "5")
    child_started(cluster, 1)
    until("the owner's Hold open", lambda: streams_open(cluster.coordinator) == {"Hold": 1.0})
    # The Hold's connection reaches its maximum age: the call ends UNAVAILABLE after the grace and
    # the owner's watch goes on as a WatchSessions over a new connection.
    watches_again_and_hears_a_takeover(cluster, first, b, sid)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")
@pytest.mark.parametrize("coordinator", [(2 * INTERVAL, "--calls-per-caller-max", "1")], indirect=True)
def test_an_owner_refused_too_many_calls_on_reconnecting_keeps_watching_and_hears_a_takeover(
        cluster: Cluster, proxies: ProxyLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's node (its own address, through the proxy) may keep one long-lived call open. Its
    link silenced, the owner notices first (its keepalive half the coordinator's) and reconnects
    while the coordinator still counts the silenced Hold: TOO_MANY_CALLS. Once the coordinator's
    own pings end that call, the owner's next try is admitted, and a takeover is heard."""
    monkeypatch.setenv(keepalive.ENV, str(INTERVAL))  # the agents' and the runs'
    a, b = cluster.host("host-a"), cluster.host("host-b")
    proxy = proxies.add("coordinator", cluster.coordinator.address, source_host="127.0.0.2")
    sid = "sess-keepalive-refused"
    first = cluster.run(a, sid, "--grace", "5", env={"HOLDFAST_COORDINATOR": proxy.address})
    child_started(cluster, 1)
    assert streams_open(cluster.coordinator) == {"Hold": 1.0}
    proxies.stall(proxy)
    until("the owner's reconnect refused TOO_MANY_CALLS", lambda: "TOO_MANY_CALLS" in first.err())
    until("the owner's watch back, as a WatchSessions",
          lambda: streams_open(cluster.coordinator) == {"WatchSessions": 1.0})
    until("the owner saying it watches again", lambda: "record again" in first.err())
    assert first.proc.poll() is None
    said = first.err()
    assert "stopped watching" not in said, said
    assert said.count("TOO_MANY_CALLS") == 1, said  # said once, however many tries it took

    second = taken_over(cluster, first, b, sid)  # heard, ended, no overlap
    os.kill(second.run_pid, signal.SIGTERM)
    assert second.wait(30) == 0
