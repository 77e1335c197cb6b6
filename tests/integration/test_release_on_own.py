"""A release rides its grant's own call (Own): the owner sends it on the call it acquired and
watched on, and the coordinator answers it there as Release would — the same checks, transaction,
refusals and answer; a refusal writes nothing, signals nothing and ends the call, and the next try
is a Release call of its own. A client releases by its own call when the Own call has ended (its
coordinator restarted) or a release it sent there went unanswered (a retry that finds its own effect
succeeds); a client from before Own (Hold, then Release) is served as before. Real etcd,
coordinator and agents in simulated hosts; each gate a real process carrying its spawn token."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import pytest

from holdfast.client.connection import Client, Held
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common import spawn_tokens
from holdfast.common.reasons import reason_of
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import run_async
from tests.integration.run_fixtures import Cluster

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
VAR = spawn_tokens.DEFAULT_VARIABLE
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
    pytest.mark.root,
    pytest.mark.timeout(120),
]


@pytest.fixture
def host(cluster: Cluster) -> SimulatedHost:
    return cluster.host("host-a")


@contextlib.contextmanager
def gate(host: SimulatedHost) -> Iterator[tuple[subprocess.Popen[bytes], pb.GateSpawn]]:
    """A gate as `run` spawns it before its Acquire: a process in the host carrying its token."""
    secret = spawn_tokens.mint_spawn_secret()
    proc = host.spawn(["sleep", "600"], env={**os.environ, VAR: spawn_tokens.spawn_token_for(secret)})
    try:
        yield proc, pb.GateSpawn(pid_hint=host.host_pid(proc), token_secret=secret, spawn_token_env=VAR)
    finally:
        end(host, proc)


def end(host: SimulatedHost, proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(host.outer_pid(proc), signal.SIGKILL)
        proc.wait(10)


def acquire(sid: str, host: SimulatedHost, spawn: pb.GateSpawn) -> pb.AcquireRequest:
    return pb.AcquireRequest(session_id=sid, host_id=host.host_id, operation_id=spawn_tokens.random_hex(16),
                             live_on_commit=True, gate=spawn)


@dataclass
class Owner:
    """A client holding its grant's Own call, its unary Release calls counted, and the gate."""

    client: Client
    grant: Grant
    proc: subprocess.Popen[bytes]
    releases: int = 0

    def __post_init__(self) -> None:
        unary = self.client.stub.Release

        def release(*args: object, **kwargs: object) -> object:
            self.releases += 1
            return unary(*args, **kwargs)

        self.client.stub.Release = release  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def owner(cluster: Cluster, host: SimulatedHost, sid: str) -> AsyncIterator[Owner]:
    async with Client(cluster.coordinator.address, host.host_id) as client:
        with gate(host) as (proc, spawn):
            grant, record = await client.acquire(sid, spawn_tokens.random_hex(16), gate=spawn, hold=True)
            assert record.lease.claim_status == pb.LIVE and sid in client.held
            yield Owner(client, grant, proc)


@contextlib.asynccontextmanager
async def channel_to(cluster: Cluster) -> AsyncIterator[tuple[grpc.aio.Channel,
                                                              coordinator_pb2_grpc.CoordinatorStub]]:
    async with grpc.aio.insecure_channel(cluster.coordinator.address) as channel:
        yield channel, coordinator_pb2_grpc.CoordinatorStub(channel)


def test_a_release_on_the_call_is_answered_there_after_its_watch_was_cancelled(
        cluster: Cluster, host: SimulatedHost) -> None:
    sid = "sess-own-release"

    async def body() -> None:
        async with owner(cluster, host, sid) as own:
            # `run`'s order: the owner watches on the call, CMD ends, the watch is cancelled while
            # it reads (which must leave the call open), then the release goes on the same call.
            watch = own.client.watch(sid, own.grant, own.grant.revision)
            await own.client.record_provider_handle(own.grant, "thread-1")
            assert (await anext(watch)).provider_handle_chain[-1].handle == "thread-1"  # read on the call
            reading = asyncio.ensure_future(anext(watch))
            await asyncio.sleep(0)  # it runs up to its read of the call's next message
            end(host, own.proc)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            record = await own.client.release(own.grant)
            assert record.lease.claim_status == pb.RELEASED and record.lease.fence == own.grant.fence
            assert record.lease.death_evidence.kind == "released"
            assert own.releases == 0 and own.client.held == {}

    asyncio.run(body())
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED
    assert cluster.record(sid).history[-1].transition == "release"


def test_a_refused_release_on_the_call_writes_nothing_kills_nothing_and_the_next_try_is_a_release_call(
        cluster: Cluster, host: SimulatedHost) -> None:
    sid = "sess-own-refused"

    async def body() -> None:
        async with owner(cluster, host, sid) as own:
            before = cluster.record(sid)
            with pytest.raises(ClientError) as refused:
                await own.client.release(own.grant)  # its tree alive
            assert refused.value.reason == "TREE_ALIVE"
            assert cluster.record(sid) == before and own.proc.poll() is None
            assert own.releases == 0 and own.client.held == {}  # the refusal ended the call
            end(host, own.proc)
            assert (await own.client.release(own.grant)).lease.claim_status == pb.RELEASED
            assert own.releases == 1

    asyncio.run(body())


async def own_call(stub: coordinator_pb2_grpc.CoordinatorStub,
                   request: pb.AcquireRequest) -> tuple[grpc.aio.StreamStreamCall, pb.AcquireResponse]:
    call = stub.Own()
    await call.write(pb.HoldRequest(acquire=request))
    return call, (await call.read()).granted


async def ended(call: grpc.aio.StreamStreamCall) -> grpc.aio.AioRpcError:
    """How the call ended, past any change it sent first."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while await asyncio.wait_for(call.read(), 30) is not grpc.aio.EOF:
            pass
    return err.value


def invalid(err: grpc.aio.AioRpcError) -> bool:
    return (err.code(), reason_of(err)) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


def refusal(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, str]:
    return err.code(), reason_of(err), err.details() or ""


def test_a_release_of_another_grant_on_the_call_is_refused_as_release_refuses_it(
        cluster: Cluster, host: SimulatedHost) -> None:
    """An old fence, a wrong secret or another session's grant sent on an Own call get the very
    refusal a Release call gets for it; nothing is written, the gates live."""
    sid, other = "sess-own-wrong", "sess-own-other"

    async def body() -> None:
        async with channel_to(cluster) as (_, stub):
            with gate(host) as (first, spawn), gate(host) as (_, other_spawn):
                granted = (await stub.Acquire(acquire(other, host, other_spawn))).grant
                old = (await stub.Acquire(acquire(sid, host, spawn))).grant
                end(host, first)
                await stub.Release(pb.ReleaseRequest(session_id=sid, fence=old.fence, secret=old.secret))
                with gate(host) as (proc, spawn):
                    request = acquire(sid, host, spawn)
                    call, now = await own_call(stub, request)
                    assert now.grant.fence == old.fence + 1
                    wrong = [pb.ReleaseRequest(session_id=sid, fence=old.fence, secret=old.secret),
                             pb.ReleaseRequest(session_id=sid, fence=now.grant.fence, secret="0" * 64),
                             pb.ReleaseRequest(session_id=other, fence=granted.fence, secret="0" * 64)]
                    for release in wrong:
                        before = (cluster.record(sid), cluster.record(other))
                        with pytest.raises(grpc.aio.AioRpcError) as unary:
                            await stub.Release(release)
                        await call.write(pb.HoldRequest(release=release))
                        assert refusal(await ended(call)) == refusal(unary.value)
                        assert (cluster.record(sid), cluster.record(other)) == before
                        assert proc.poll() is None
                        call, again = await own_call(stub, request)  # replayed: the same grant
                        assert again.grant.fence == now.grant.fence

    asyncio.run(body())


def test_an_own_call_takes_an_acquire_first_and_then_only_a_release(cluster: Cluster,
                                                                    host: SimulatedHost) -> None:
    sid = "sess-own-order"

    async def body() -> None:
        async with channel_to(cluster) as (channel, stub):
            with gate(host) as (proc, spawn):
                release = pb.ReleaseRequest(session_id=sid, fence=1, secret="0" * 64)
                for first in ([pb.HoldRequest(release=release)], [pb.HoldRequest()], []):
                    call = stub.Own()
                    for message in first:
                        await call.write(message)
                    await call.done_writing()
                    err = await ended(call)
                    assert invalid(err)
                    assert "first message is its AcquireRequest" in (err.details() or "")
                with pytest.raises(grpc.RpcError):
                    cluster.record(sid)  # nothing was written
                request = acquire(sid, host, spawn)
                for after in (pb.HoldRequest(acquire=request), pb.HoldRequest()):
                    call, _ = await own_call(stub, request)
                    before = cluster.record(sid)
                    await call.write(after)
                    assert invalid(await ended(call))
                    assert cluster.record(sid) == before and proc.poll() is None
                # Bytes that are no HoldRequest at all, first or after the grant.
                raw = channel.stream_stream("/holdfast.v1.Coordinator/Own", request_serializer=bytes,
                                            response_deserializer=pb.HoldEvent.FromString)
                for messages in ([b"\xff\xff\xff"], [pb.HoldRequest(acquire=request).SerializeToString(),
                                                       b"\xff\xff\xff"]):
                    call = raw()
                    for message in messages:
                        await call.write(message)
                    assert invalid(await ended(call))
                    assert cluster.record(sid) == before and proc.poll() is None

    asyncio.run(body())


def test_the_release_is_a_call_of_its_own_once_the_own_call_ended(cluster: Cluster,
                                                                 host: SimulatedHost) -> None:
    async def body() -> None:
        async with owner(cluster, host, "sess-own-restart") as own:
            end(host, own.proc)
            cluster.coordinator.stop()  # the Own call ends under the owner (UNAVAILABLE)
            cluster.coordinator.start()
            assert (await own.client.release(own.grant)).lease.claim_status == pb.RELEASED
            assert own.releases == 1

    asyncio.run(body())


def test_a_release_sent_on_the_call_and_left_unanswered_is_retried_by_a_call_of_its_own(
        cluster: Cluster, host: SimulatedHost) -> None:
    """The release lands on the Own call and its answer is lost (the call breaks first): the client
    asks again by Release, is told the grant is no longer held, and finds its own release there."""
    sid = "sess-own-lost"

    async def answer_lost(held: Held) -> pb.ReleaseResponse | None:
        while cluster.record(sid).record.lease.claim_status != pb.RELEASED:  # it landed on the call
            await asyncio.sleep(0.02)
        held.call.cancel()
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   details="connection lost")

    async def body() -> None:
        async with owner(cluster, host, sid) as own:
            end(host, own.proc)
            own.client._released = answer_lost  # type: ignore[method-assign]
            record = await own.client.release(own.grant)
            assert record.lease.claim_status == pb.RELEASED and record.lease.fence == own.grant.fence
            assert own.releases == 1

    asyncio.run(body())


@run_async
async def test_a_client_from_before_own_holds_and_releases_by_a_call_of_its_own(cluster: Cluster,
                                                                               host: SimulatedHost) -> None:
    async with channel_to(cluster) as (_, stub):
        with gate(host) as (proc, spawn):
            held = stub.Hold(acquire("sess-own-older-client", host, spawn))
            grant = (await held.read()).granted.grant
            end(host, proc)
            held.cancel()
            released = await stub.Release(pb.ReleaseRequest(session_id=grant.session_id, fence=grant.fence,
                                                             secret=grant.secret))
    assert released.record.lease.claim_status == pb.RELEASED
