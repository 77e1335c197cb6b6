"""A client's channel starts connecting when the client is made, not at its first call: `run` does
its local work (CMD resolved, grant directory, gate spawned) while the connection is set up; and a
coordinator from before Hold is asked by Acquire."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from holdfast.client.connection import Client
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
