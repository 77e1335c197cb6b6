"""A client's channel starts connecting when the client is made, not at its first call: `run` does
its local work (CMD resolved, grant directory, gate spawned) while the connection is set up; and a
coordinator from before Hold is asked by Acquire; a watch that ends without a status is asked again
and said, never left ended in silence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)


def test_the_channel_is_ready_before_any_call(coordinator: Coordinator) -> None:
    async def body() -> grpc.ChannelConnectivity:
        async with Client(coordinator.address, "host-connect") as client:
            state = client.channel.get_state()
            for _ in range(10):  # idle → connecting → ready; a few more for a retried connect
                if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.SHUTDOWN):
                    break
                # An idle channel (one that waits for its first call to connect) never changes.
                await asyncio.wait_for(client.channel.wait_for_state_change(state), 10)
                state = client.channel.get_state()
            return state

    assert asyncio.run(body()) is grpc.ChannelConnectivity.READY


class OlderCoordinator(grpc.GenericRpcHandler):
    """A stand-in for a coordinator from before Hold: Acquire answered with a fixed grant, every other
    method unknown (UNIMPLEMENTED, as gRPC answers a method a server does not serve); each call's
    method recorded."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        self.asked.append(details.method.rsplit("/", 1)[1])  # type: ignore[attr-defined]
        if not details.method.endswith("/Acquire"):  # type: ignore[attr-defined]
            return None

        async def acquire(request: pb.AcquireRequest, _context: object) -> pb.AcquireResponse:
            return pb.AcquireResponse(grant=pb.Grant(session_id=request.session_id, fence=3, secret="s"),
                                      revision=7)

        return grpc.unary_unary_rpc_method_handler(acquire, pb.AcquireRequest.FromString,
                                                   pb.AcquireResponse.SerializeToString)


def test_a_coordinator_without_hold_is_asked_by_acquire_and_hold_is_not_tried_again() -> None:
    async def body() -> list[str]:
        older = OlderCoordinator()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((older,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with Client(f"127.0.0.1:{port}", "host-older") as client:
                grant, _ = await client.acquire("sess-older", "0" * 32, hold=True)
                assert (grant.fence, grant.revision, client.held) == (3, 7, {})
                await client.acquire("sess-older", "1" * 32, hold=True)
                return older.asked
        finally:
            await server.stop(None)

    assert asyncio.run(body()) == ["Hold", "Acquire", "Acquire"]


class QuietWatches(grpc.GenericRpcHandler):
    """A stand-in whose WatchSessions sends one record, numbered by the call, and ends with no
    status: no coordinator does, and an owner's watch must not then stop in silence."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not details.method.endswith("/WatchSessions"):  # type: ignore[attr-defined]
            return None

        async def watch(request: pb.WatchSessionsRequest, _context: object) -> AsyncIterator[pb.SessionEvent]:
            self.calls += 1
            yield pb.SessionEvent(record=pb.SessionRecord(session_id=request.session_id,
                                                          provider=f"call-{self.calls}"), resync=True)

        return grpc.unary_stream_rpc_method_handler(watch, pb.WatchSessionsRequest.FromString,
                                                    pb.SessionEvent.SerializeToString)


def test_a_watch_ended_without_a_status_is_asked_again_and_said_once() -> None:
    async def body() -> tuple[list[str], list[str]]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((QuietWatches(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        lost: list[ClientError] = []
        try:
            async with Client(f"127.0.0.1:{port}", "host-quiet") as client:
                seen = []
                async for event in client.session_events("sess-quiet", lost=lost.append):
                    seen.append(event.record.provider)
                    if len(seen) == 3:
                        break
                return seen, [str(err) for err in lost]
        finally:
            await server.stop(None)

    seen, lost = asyncio.run(body())
    assert seen == ["call-1", "call-2", "call-3"]
    # Said once per outage: each reconnect delivered before the next end, so once per end here.
    assert len(lost) == 2 and all("the watch ended without a status" in text for text in lost), lost
