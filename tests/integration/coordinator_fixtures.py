"""Fixtures for coordinator integration tests: a real etcd per module, a fresh key prefix per test."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path

import pytest

from holdfast.coordinator.etcd_server import EtcdServer


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(Path(tmp_path_factory.mktemp("etcd")) / "data", fast_election=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prefix() -> str:
    return f"/holdfast-test/{uuid.uuid4().hex}/"


def run_async(fn: Callable[..., Coroutine[object, object, None]]) -> Callable[..., None]:
    """Runs an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 50))

    return wrapper
