"""10,000 session records: time to page through them with ListSessions, and the coordinator's RSS.
Prints numbers; asserts nothing. Run: .venv/bin/python bench/bench_coordinator_list.py
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from holdfast.coordinator import fencing, records
from holdfast.coordinator.store import DEFAULT_PREFIX, Put, Store
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

N = 10_000


async def populate(url: str, n: int = N) -> None:
    store = Store.connect(url, prefix=DEFAULT_PREFIX)
    for start in range(0, n, 100):  # etcd's default limit is 128 operations per transaction
        puts = []
        for i in range(start, start + 100):
            rec = records.new_record(f"session-{i:06d}", "codex", "/work")
            rec.lease.fence, rec.lease.claim_status = 1, pb.RELEASED
            rec.lease.grant_secret_hash = fencing.hash_secret(fencing.mint_grant_secret())
            puts.append(Put(store.key("sessions", rec.session_id), records.encode(rec)))
        await store.txn([], puts)
    await store.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="holdfast-bench-list-"))
    etcd = EtcdServer(root / "etcd", fast_election=True).start()
    ready = root / "coord.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "holdfast.cli",
            "coordinator",
            "serve",
            "--etcd",
            etcd.url,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(populate(etcd.url))
        while not ready.exists():
            time.sleep(0.05)
        coord = coordinator_pb2_grpc.CoordinatorStub(
            grpc.insecure_channel(json.loads(ready.read_text())["address"])
        )
        before = rss_mb(proc.pid)
        t = time.perf_counter()
        seen, token = 0, ""
        while True:
            page = coord.ListSessions(pb.ListSessionsRequest(page_size=500, page_token=token), timeout=30)
            seen += len(page.records)
            token = page.next_page_token
            if not token:
                break
        elapsed = time.perf_counter() - t
        print(
            f"ListSessions over {seen} records in pages of 500: {elapsed * 1000:.0f} ms; "
            f"coordinator RSS {before:.0f} MB before, {rss_mb(proc.pid):.0f} MB after"
        )
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
