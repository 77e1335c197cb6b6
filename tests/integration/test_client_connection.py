"""A client's channel starts connecting when the client is made, not at its first call: `run` does
its local work (CMD resolved, grant directory, gate spawned) while the connection is set up."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from holdfast.client.connection import Client
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
