"""A waiting run misses no release: one that lands between its Acquire's refusal and its watch
opening is taken at once, not after the run's whole --wait budget. Real etcd, coordinator and an
agent in a simulated host; two library clients on that host."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.client.acquire import RunSpec, obtain
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common.reasons import Reason
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import Coordinator, run_async
from tests.integration.test_coordinator_service import register, stub

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
BUDGET_S = 30.0  # the waiting run's; the test allows it well under that
PROMPT_S = 10.0


@pytest.fixture
def host(coordinator: Coordinator, tmp_path: Path) -> Iterator[SimulatedHost]:
    a = SimulatedHost("host-a", 50, tmp_path / "a")
    a.start()
    try:
        register(stub(coordinator.address), a, ttl=60)
        yield a
    finally:
        a.stop()


class ReleasedOnRefusal(Client):
    """B's client: its first Acquire is answered at once (wait_seconds 0: a refusal as one at the end
    of the coordinator's hold), and that refusal has A release before it reaches `obtain`: the
    release lands after the refusal was judged and before B's wait begins."""

    def __init__(self, address: str, host_id: str, other: Client, grant: Grant) -> None:
        super().__init__(address, host_id)
        self.other, self.grant, self.calls = other, grant, 0

    async def acquire(self, *args, **kwargs) -> tuple[Grant, pb.SessionRecord]:  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 1:
            kwargs["wait_seconds"] = 0.0
        try:
            return await super().acquire(*args, **kwargs)
        except ClientError as err:
            if self.calls == 1:
                assert err.reason == Reason.RESERVED
                await self.other.release(self.grant)
            raise


@run_async
async def test_a_release_right_after_the_refusal_is_not_waited_out(coordinator: Coordinator,
                                                                    host: SimulatedHost) -> None:
    sid = "sess-wait-release-1"
    async with Client(coordinator.address, host.host_id) as a:
        reserved, _ = await a.acquire(sid, secrets.token_hex(16))
        async with ReleasedOnRefusal(coordinator.address, host.host_id, a, reserved) as b:
            grant, record = await asyncio.wait_for(
                obtain(b, RunSpec(sid, ["true"], wait=BUDGET_S), secrets.token_hex(16), say=lambda _: None),
                PROMPT_S)
            assert (grant.fence, b.calls) == (reserved.fence + 1, 2)
            assert record.lease.fence == grant.fence
