"""A replica fences each lost host on its own: a fence device that hangs for one host holds back
neither another host's fence nor the passes, and a host has at most one attempt in flight. Real
etcd, a replica in this process, a fence agent that blocks on a FIFO until the test lets it go."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path

import pytest

from holdfast.coordinator.fence_rules import FencerSpec
from holdfast.coordinator.host_fencing import FencingSettings
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import Context, acquire, record_of, register

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(60)
HUNG, QUICK = "fence-par-a", "fence-par-b"  # sorted: the hung host comes first


def agent(tmp: Path) -> FencingSettings:
    """Logs `action plug` per action; `off` of HUNG waits for a line on the FIFO `release`."""
    release = tmp / "release"
    os.mkfifo(release)
    program = tmp / "fence_blocking"
    program.write_text("#!/bin/sh\n" + textwrap.dedent(f"""\
        input=$(cat)
        action=$(echo "$input" | sed -n 's/^action=//p')
        plug=$(echo "$input" | sed -n 's/^plug=//p')
        echo "$action $plug" >> {tmp / "agent.log"}
        if [ "$action" = off ]; then
            [ "$plug" = {HUNG} ] && read line < {release}
            echo "Success: Powered OFF"; exit 0
        fi
        echo "Status: OFF"; exit 2
    """))
    program.chmod(0o755)
    # Due as soon as seen absent: the test is about what runs at once, not about when.
    return FencingSettings((FencerSpec("fence-par-*", str(program), (("plug", "{host}"),)),),
                           host_loss_after=0, timeout=30)


async def lost_with_a_reservation(svc: CoordinatorService, host_id: str, sid: str) -> None:
    lease_id = await register(svc, host_id)
    await acquire(svc, Context(), sid, host_id)
    await svc.store.revoke_lease(lease_id)


@run_async
async def test_a_hung_device_holds_back_no_other_hosts_fence(etcd: EtcdServer, prefix: str,
                                                            tmp_path: Path) -> None:
    svc = CoordinatorService(Store(open_channel(etcd.url), prefix), fencing=agent(tmp_path), name="one")
    fencing = svc.host_fencing
    try:
        await lost_with_a_reservation(svc, HUNG, "sess-par-a")
        await lost_with_a_reservation(svc, QUICK, "sess-par-b")
        # A pass starts both attempts and returns; it waited for the hung off before.
        await asyncio.wait_for(fencing.pass_once(), 10)
        hung, quick = fencing.attending[HUNG], fencing.attending[QUICK]
        await asyncio.wait_for(quick, 20)
        freed = await record_of(svc, "sess-par-b")
        assert freed is not None and freed.lease.claim_status == pb.RELEASED
        assert freed.lease.death_evidence.kind == "host-fenced"
        assert not hung.done()
        # Another pass meanwhile starts nothing more for the host whose attempt is running.
        await asyncio.wait_for(fencing.pass_once(), 10)
        assert fencing.attending == {HUNG: hung}
        # The hung device answers (the FIFO's open waits for the agent's read end: its off began).
        await asyncio.to_thread((tmp_path / "release").write_text, "go\n")
        await asyncio.wait_for(hung, 20)
        assert (tmp_path / "agent.log").read_text().splitlines().count(f"off {HUNG}") == 1
        freed = await record_of(svc, "sess-par-a")
        assert freed is not None and freed.lease.claim_status == pb.RELEASED
        assert fencing.attending == {}
    finally:
        for task in list(fencing.attending.values()):
            task.cancel()
        await svc.store.close()
