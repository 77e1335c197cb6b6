"""Fixtures for coordinator integration tests: a real etcd per module, a fresh key prefix per test."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from holdfast.coordinator.store import Store
from holdfast.localstack.etcd_server import EtcdServer


def etcd_server(tmp_path_factory: pytest.TempPathFactory,
                tls_dir: Path | None = None) -> Iterator[EtcdServer]:
    """A real etcd for a module's tests, on etcd's own CA when `tls_dir` (`<certs init dir>/etcd`)."""
    server = EtcdServer(Path(tmp_path_factory.mktemp("etcd")) / "data", fast_election=True,
                        tls_dir=tls_dir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    yield from etcd_server(tmp_path_factory)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[EtcdServer]:
    """An etcd on the etcd CA of the module's `pki` fixture (<pki>/etcd, as `certs init` makes it),
    for a coordinator serving with --tls-dir <pki>."""
    server = EtcdServer(Path(tmp_path_factory.mktemp("etcd-tls")) / "data", fast_election=True,
                        tls_dir=pki / "etcd").start()
    try:
        yield server
    finally:
        server.stop()


def snapshot(etcd_url: str, prefix: str,
             credentials: grpc.ChannelCredentials | None = None) -> list[tuple[str, bytes]]:
    """Every key and value under prefix: compared before and after to prove nothing was written."""

    async def read() -> list[tuple[str, bytes]]:
        store = Store.connect(etcd_url, credentials, prefix=prefix)
        try:
            entries, _ = await store.list_prefix(prefix)
            return [(e.key, e.value) for e in entries]
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def prefix() -> str:
    return f"/holdfast-test/{uuid.uuid4().hex}/"


def run_async(fn: Callable[..., Coroutine[object, object, None]]) -> Callable[..., None]:
    """Runs an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 50))

    return wrapper


@dataclass
class Coordinator:
    """A `holdfast coordinator serve` process, restartable on the same port."""

    etcd_url: str
    state_dir: Path
    prefix: str
    listen: str = "127.0.0.1:0"
    address: str = ""
    process: subprocess.Popen[bytes] | None = None
    args: tuple[str, ...] = ()  # e.g. ("--tls-dir", DIR) or ("--metrics-listen", ADDR)
    metrics: str = ""  # the /metrics address its ready file names, when started with --metrics-listen
    health: str = ""  # the plaintext health address, when started with --health-listen
    enroll: str = ""  # the enrollment listener, when started with --enroll-listen
    env: dict[str, str] = field(default_factory=dict)  # added to the process's environment

    def start(self, timeout: float = 15.0) -> Coordinator:
        ready = self.state_dir / f"coordinator-{uuid.uuid4().hex}.json"
        log = open(self.state_dir / "coordinator.log", "ab")  # noqa: SIM115 - handed to the child
        with log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "holdfast.cli", "coordinator", "serve", "--etcd",
                 self.etcd_url, "--listen", self.address or self.listen, "--ready-file", str(ready),
                 "--prefix", self.prefix, *self.args], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"coordinator did not start; see {self.state_dir}/coordinator.log")
            time.sleep(0.05)
        announced = json.loads(ready.read_text())
        self.address, self.metrics = announced["address"], announced.get("metrics", "")
        self.health = announced.get("health", "")
        self.enroll = announced.get("enroll", "")
        return self

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture
def coordinator(etcd: EtcdServer, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:
    server = Coordinator(etcd.url, tmp_path, prefix).start()
    try:
        yield server
    finally:
        server.stop()
