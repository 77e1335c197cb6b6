"""A reservation never runs CMD: a parent that dies between Acquire and commit leaves a gate that
exits unrun, and its reservation is superseded after the commit deadline; a commit that lost the
race to such a superseding grant leaves its CMD unstarted. Real etcd, agents, processes."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.coordinator import keys
from holdfast.coordinator.store import Entry, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.lifecycle_helpers import cli
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
# The coordinator's (default 30 s): a dead reserver holds its session until then, and is superseded
# after it. Long enough for the steps before the deadline to take place under load.
COMMIT_WINDOW_S = "8"


@pytest.fixture
def coordinator(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(etcd.url, tmp_path, prefix, args=("--commit-window-seconds", COMMIT_WINDOW_S))
    server.start()
    try:
        yield server
    finally:
        server.stop()
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]

# Uses the library step by step: Acquire, spawn the gate, then wait for the test's word to commit.
RESERVER = """
import asyncio, json, os, sys
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.owner import grant_environment, spawn_environment
from holdfast.client.gate import Gate

async def main():
    session, marker = sys.argv[1:3]
    async with Client() as client:
        grant, _ = await client.acquire(session, os.urandom(16).hex())
        env = {**spawn_environment(grant.session_id, grant.coordinator, grant.spawn_token_env,
                                   grant.spawn_token), **grant_environment(grant, None, "/nonexistent")}
        gate = Gate(["touch", marker], env)
        print(json.dumps({"fence": grant.fence}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        try:
            await client.commit(grant, gate.pid, gate.is_process)
        except ClientError as err:
            gate.abort()
            print(json.dumps({"commit": err.reason, "gate": gate.process.wait()}), flush=True)
            return
        gate.release()
        print(json.dumps({"commit": "ok", "gate": gate.process.wait()}), flush=True)

asyncio.run(main())
"""


def reserve(cluster: Cluster, host, session: str, marker: Path) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    proc = host.spawn([sys.executable, "-c", RESERVER, session, str(marker)], env=cluster.env(host),
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert json.loads(proc.stdout.readline()) == {"fence": 1}
    return proc


def test_dead_reserver_never_runs_cmd_and_a_losing_commit_leaves_cmd_unstarted(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    dead_sid, race_sid = "sess-reserve-01", "sess-reserve-02"
    dead_marker, race_marker = cluster.tmp / "dead-ran", cluster.tmp / "race-ran"
    dead = reserve(cluster, a, dead_sid, dead_marker)
    loser = reserve(cluster, a, race_sid, race_marker)
    try:
        reserver = a.outer_pid(dead)
        gate = until("the gate", lambda: descendants(reserver))[0]  # type: ignore[index]
        gate_fd = os.pidfd_open(gate)
        os.kill(reserver, signal.SIGKILL)  # dies between Acquire and commit
        assert select.select([gate_fd], [], [], 10)[0]  # the gate ended on the closed pipe
        os.close(gate_fd)
        # Before its commit deadline the reservation holds: the refusal writes nothing.
        held = cluster.run(b, dead_sid, cmd=["touch", str(dead_marker)])
        assert held.wait(30) == 75 and "RESERVED" in held.err()
        deadline_ms = cluster.record(dead_sid).record.lease.commit_deadline_unix_ms
        assert cluster.record(dead_sid).record.lease.fence == 1
        time.sleep(max(deadline_ms / 1000 - time.time(), 0) + 0.2)
        fence_file = cluster.tmp / "b"
        taken = cluster.run(b, dead_sid, cmd=["sh", "-c", 'echo "$HOLDFAST_FENCE" > "$0"', str(fence_file)])
        assert taken.wait(30) == 0
        assert fence_file.read_text().strip() == "2"
        grants = [(h.fence, h.detail.split(";")[0]) for h in cluster.record(dead_sid).history
                  if h.transition == "grant"]
        assert grants == [(1, "FREE"), (2, "RESERVATION_SUPERSEDED")]
        assert not dead_marker.exists()
        # The race: host-b supersedes the second reservation and commits; then host-a commits late.
        winner = cluster.run(b, race_sid, cmd=["sleep", "300"])
        until("host-b's commit", lambda: cluster.record(race_sid).record.lease.claim_status == pb.LIVE)
        loser.stdin.write(b"commit\n")  # type: ignore[union-attr]
        loser.stdin.flush()  # type: ignore[union-attr]
        result = json.loads(loser.stdout.readline())  # type: ignore[union-attr]
        assert result["commit"] == "STALE_FENCE" and result["gate"] != 0
        assert not race_marker.exists()
        assert cluster.record(race_sid).record.lease.fence == 2
        os.kill(winner.run_pid, signal.SIGTERM)
        assert winner.wait(30) == 128 + signal.SIGTERM  # sleep's own status: killed by the signal
    finally:
        for proc in (dead, loser):
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def stored(cluster: Cluster, session: str) -> Entry | None:
    """The session's record as etcd holds it: its bytes and revisions."""
    async def get() -> Entry | None:
        store = Store.connect(cluster.coordinator.etcd_url, prefix=cluster.coordinator.prefix)
        try:
            return await store.get(keys.session(store, session))
        finally:
            await store.close()

    return asyncio.run(get())


def test_a_reservation_made_before_a_drain_is_refused_its_commit_and_never_runs_cmd(cluster: Cluster) -> None:
    host, sid, marker = cluster.host("host-rdr"), "sess-reserve-03", cluster.tmp / "drained-ran"
    reserver = reserve(cluster, host, sid, marker)
    try:
        code, out = cli(cluster.coordinator.address, "drain", "host-rdr")
        # Still held (75): a reservation is asked nothing; only its commit can be refused.
        assert code == 75 and out["draining"] is True and out["handoff_requested"] == [], out
        before = stored(cluster, sid)
        assert before is not None and cluster.record(sid).record.lease.claim_status == pb.RESERVED
        reserver.stdin.write(b"commit\n")  # type: ignore[union-attr]
        reserver.stdin.flush()  # type: ignore[union-attr]
        result = json.loads(reserver.stdout.readline())  # type: ignore[union-attr]
        assert result["commit"] == "HOST_DRAINING" and result["gate"] != 0, result
        assert reserver.wait(30) == 0
        assert not marker.exists()
        assert stored(cluster, sid) == before
        assert cluster.record(sid).record.lease.claim_status == pb.RESERVED
    finally:
        if reserver.poll() is None:
            reserver.kill()
        reserver.wait(10)
