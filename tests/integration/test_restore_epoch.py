"""`holdfast admin restore-epoch` after a REAL etcd snapshot restore (docs/design.md §3).

A session is released at fence 1, etcd is snapshotted, the session is granted again at fence 2 on a
simulated host, and that `run` is killed -9 so its CMD lives on as an orphan only the agent can see.
etcd is then restored from the snapshot into a new data dir: the record is back at fence 1. After
restore-epoch the orphan is stopped (judged by the process table), the fence-2 grant cannot write,
and a new grant lands above every fence issued before. A reservation taken before the snapshot and
committed after it stays reserved and its CMD is stopped. A session live in the snapshot whose owner
died meanwhile is released only on its host's agent's proof. A session first granted after the
snapshot starts again above the epoch, not at its already-issued fence 1.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from holdfast.client.connection import Client
from holdfast.client.grant import Grant
from holdfast.coordinator.store import Put, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.lifecycle_helpers import cli, fenced_put_reason, grant_copier
from tests.integration.run_fixtures import Cluster, until
from tests.integration.test_coordinator_service import acquire, spawn_owner
from tests.integration.test_run_sessions import gone

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
SID = "sess-restore-01"
DEAD = "sess-restore-dead"
NEW = "sess-restore-new"  # first granted after the snapshot: the restored etcd has no record of it
RES = "sess-restore-res"  # reserved at the snapshot, committed after it: CMD runs, unrecorded
EPOCH = 1000
PREFIX = "/holdfast-restore/"


def etcdctl(url: str, *argv: str) -> None:
    subprocess.run(["etcdctl", "--endpoints", url, *argv], check=True, capture_output=True,
                   env={**os.environ, "ETCDCTL_API": "3"}, timeout=60)


class Stack:
    """etcd, a coordinator on it and simulated hosts; `restore` serves a snapshot of that etcd on
    its ports, as the runbook does (the coordinator stopped first, started again by the caller)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.first = EtcdServer(tmp / "etcd-1", fast_election=True).start()
        self.restored: EtcdServer | None = None
        self.coordinator = Coordinator(self.first.url, tmp, PREFIX).start()
        self.cluster = Cluster(self.coordinator, tmp)

    def restore(self, snapshot: Path) -> EtcdServer:
        self.coordinator.stop()
        self.first.stop()
        data, peer = self.tmp / "etcd-2", f"http://127.0.0.1:{self.first.peer_port}"
        etcdctl(self.first.url, "snapshot", "restore", str(snapshot), "--data-dir", str(data),
                "--name", "holdfast", "--initial-cluster", f"holdfast={peer}",
                "--initial-advertise-peer-urls", peer)
        self.restored = EtcdServer(data, fast_election=True, client_port=self.first.client_port,
                                   peer_port=self.first.peer_port).start()
        self.coordinator.etcd_url = self.restored.url
        return self.restored

    def close(self) -> None:
        self.cluster.stop()
        self.coordinator.stop()
        if self.restored is not None:
            self.restored.stop()
        self.first.stop()


def test_restore_epoch_after_a_real_snapshot_restore(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    first, coordinator, cluster = stack.first, stack.coordinator, stack.cluster
    try:
        host = cluster.host("host-r")
        assert cluster.run(host, SID, cmd=["true"]).wait(30) == 0
        assert cluster.record(SID).record.lease.claim_status == pb.RELEASED
        # Live at the snapshot, dead by the restore: re-adjudicated, released on its host's proof.
        dead_path = tmp_path / "grant-dead.json"
        dead = cluster.run(host, DEAD, cmd=grant_copier(dead_path))
        until("the live session's grant file", dead_path.exists)
        reserved = acquire(cluster.stub, RES, host.host_id).grant
        snapshot = tmp_path / "snap.db"
        etcdctl(first.url, "snapshot", "save", str(snapshot))
        carrier = spawn_owner(host, reserved)
        cluster.stub.CommitOwner(pb.CommitOwnerRequest(session_id=RES, fence=reserved.fence,
                                                       secret=reserved.secret,
                                                       pid_hint=host.host_pid(carrier)), timeout=30)
        carrier_pid = host.outer_pid(carrier)

        dead_tree = [dead.run_pid, *descendants(dead.run_pid)]
        for pid in dead_tree:
            os.kill(pid, signal.SIGKILL)
        dead.wait(10)
        assert all(gone(pid, 5) for pid in dead_tree)

        # Granted after the snapshot: fence 2, its CMD copies the grant and keeps running.
        grant_path = tmp_path / "grant-2.json"
        second = cluster.run(host, SID, cmd=grant_copier(grant_path))
        until("the fence-2 grant file", grant_path.exists)
        old = Grant.from_file(grant_path)
        assert old.fence == 2
        assert fenced_put_reason(cluster.stub, old, "k") == ""  # a real, live grant
        # The grant file appears just before CMD's shell execs sleep: wait for the exec.
        orphan = until("CMD's sleep", lambda: [p for p in descendants(second.run_pid)
                                               if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"])
        assert len(orphan) == 1
        os.kill(second.run_pid, signal.SIGKILL)  # its `run` is gone: only the agent can stop CMD now
        second.wait(10)
        assert not gone(orphan[0])
        new_first = tmp_path / "grant-new-session-1.json"
        assert cluster.run(host, NEW, cmd=grant_copier(new_first, 1)).wait(30) == 0
        assert Grant.from_file(new_first).fence == 1

        # Restore the snapshot into a new data dir and serve it on the same ports.
        restored = stack.restore(snapshot)
        # The runbook's gate, put before any coordinator serves the restored data.
        etcdctl(restored.url, "put", f"{PREFIX}restore-pending", "restored from snap.db")
        coordinator.start()
        until("host-r registered after the restore", lambda: any(
            h.host_id == "host-r" for h in cluster.stub.ListHosts(pb.ListHostsRequest(), timeout=5).hosts))
        assert cluster.record(SID).record.lease.fence == 1  # the restore rolled the fence back
        # No grant on rolled-back fences before restore-epoch: the plain run is refused and runs nothing.
        early = cluster.run(host, SID, cmd=["touch", str(tmp_path / "early-ran")])
        assert early.wait(30) == 75 and "RESTORE_PENDING" in early.err()
        assert not (tmp_path / "early-ran").exists()

        code, report = cli(coordinator.address, "admin", "restore-epoch", "--epoch", str(EPOCH),
                           "--reason", "etcd restored from snap.db")
        assert code == 0, report
        assert report["grants_reopened"] is True
        rows = {r["session_id"]: r for r in report["sessions"]}
        assert rows[DEAD]["outcome"] == "released", rows[DEAD]
        assert cluster.record(DEAD).record.lease.death_evidence.kind in ("exit-observed", "pid-absent")
        row = rows[SID]
        assert row["session_id"] == SID and row["outcome"] == "released"
        assert int(row["minimum_next_fence"]) == 2 + EPOCH
        [host_row] = report["hosts"]
        assert host_row["complete"] is True and len(host_row["orphans_stopped"]) == 2, host_row
        assert gone(orphan[0], 10)  # process table: the orphan is stopped
        # The reservation stays one (never released on a restore): its carrier started CMD on a
        # commit the restored etcd lost, so it is stopped like any owner no record knows.
        assert rows[RES]["outcome"] == "reserved"
        assert cluster.record(RES).record.lease.claim_status == pb.RESERVED
        assert gone(carrier_pid, 10)
        assert fenced_put_reason(cluster.stub, Grant(RES, reserved.fence, reserved.secret, "", "", ""),
                                 "k") != ""

        # The old owner cannot write; a new grant is above every fence issued before the restore.
        assert fenced_put_reason(cluster.stub, old, "k") == "STALE_FENCE"
        new_path = tmp_path / "grant-new.json"
        third = cluster.run(host, SID, cmd=grant_copier(new_path, 1))
        until("the new grant file", new_path.exists)
        new = Grant.from_file(new_path)
        assert new.fence == 2 + EPOCH > old.fence
        assert fenced_put_reason(cluster.stub, new, "k") == ""
        assert fenced_put_reason(cluster.stub, old, "k") == "STALE_FENCE"
        assert third.wait(30) == 0
        history = [h.transition for h in cluster.record(SID).history]
        assert "restore-epoch" in history

        # An id the restored etcd never saw does not start again at fence 1, which was issued.
        assert NEW not in rows
        new_again = tmp_path / "grant-new-session-2.json"
        assert cluster.run(host, NEW, cmd=grant_copier(new_again, 1)).wait(30) == 0
        assert Grant.from_file(new_again).fence == EPOCH

        # A node that may run owners but cannot be searched closes grants again, until it is.
        code, report = cli(coordinator.address, "admin", "restore-epoch", "--epoch", str(EPOCH),
                           "--expect-host", "host-gone", "--reason", "host-gone was down")
        assert code == 1 and not report.get("grants_reopened", False)
        assert [h["error"] for h in report["hosts"] if h["host_id"] == "host-gone"]
        closed = cluster.run(host, NEW, cmd=["touch", str(tmp_path / "late-ran")])
        assert closed.wait(30) == 75 and "RESTORE_PENDING" in closed.err()
        assert not (tmp_path / "late-ran").exists()
    finally:
        stack.close()


def test_an_owners_watch_from_its_grant_revision_hears_the_restored_record(tmp_path: Path) -> None:
    """An owner granted after the snapshot watches from its grant's revision; etcd is restored
    below it. Its watch reconnects while the coordinator is away and must then list: from the
    grant's revision on, the restored etcd (whose revisions are lower, and reused by another
    history) would show it nothing, and the owner would never hear that its fence is gone."""
    stack = Stack(tmp_path)
    try:
        host = stack.cluster.host("host-w")
        sid = "sess-restore-watch"

        async def body() -> None:
            async with Client(stack.coordinator.address, host.host_id) as client:
                held, _ = await client.acquire(sid, secrets.token_hex(16))
                await client.release(held)
                snapshot = tmp_path / "snap.db"
                await asyncio.to_thread(etcdctl, stack.first.url, "snapshot", "save", str(snapshot))
                store = Store.connect(stack.first.url, prefix=PREFIX)
                try:  # the grant's revision well past what the restored etcd reaches by the watch
                    for i in range(200):
                        await store.txn([], [Put(store.key("noise"), str(i).encode())])
                finally:
                    await store.close()
                grant, _ = await client.acquire(sid, secrets.token_hex(16))
                assert grant.fence == 2 and grant.revision > 0
                heard: dict[str, asyncio.Queue[pb.SessionRecord]] = {"across": asyncio.Queue(),
                                                                     "after": asyncio.Queue()}

                async def watch(which: str) -> None:
                    async for record in client.watch(sid, grant, grant.revision):
                        heard[which].put_nowait(record)

                # One watch open across the restore: its reconnect lists. One first opened after it,
                # once the channel is up again (a run paused from its grant to the restore's end):
                # the restored etcd has not reached the grant's revision, so the coordinator lists.
                watching = [asyncio.create_task(watch("across"))]
                try:
                    await asyncio.to_thread(stack.restore, snapshot)
                    await asyncio.to_thread(stack.coordinator.start)
                    for which, queue in heard.items():
                        if which == "after":
                            watching.append(asyncio.create_task(watch("after")))
                        record = await asyncio.wait_for(queue.get(), 30)
                        assert record.lease.fence == 1 and record.lease.claim_status == pb.RELEASED, which
                finally:
                    for task in watching:
                        task.cancel()

        asyncio.run(body())
    finally:
        stack.close()
