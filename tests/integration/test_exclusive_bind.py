"""Issue 17, safety 1: a holdfast server binds its port exclusively and a taken port stops it at
once, naming the address and (where it can be seen) the holder — two coordinators never share one
address. Real sockets, real gRPC servers and real `holdfast coordinator serve` processes."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.common import listeners, serving
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

from .coordinator_fixtures import Coordinator, coordinator, etcd, prefix  # noqa: F401


@pytest.fixture
def held_port() -> Iterator[tuple[socket.socket, str]]:
    """A listening socket that, like gRPC's default, allows SO_REUSEPORT siblings."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock, f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def refusal(listen: str, health_listen: str = "") -> str:
    """The one line a server that cannot bind stops with; a server that did start is stopped again
    and fails the test (it would otherwise keep the test process alive)."""

    async def attempt() -> None:
        started = await serving.start(listen, "test.Service", lambda _server: None,
                                      health_listen=health_listen)
        await serving.drain(started, 0)

    try:
        asyncio.run(attempt())
    except SystemExit as stopped:
        return str(stopped.code)
    pytest.fail(f"a second server started on {listen or health_listen}")


def test_taken_port_fails_in_one_line_naming_the_holder(held_port: tuple[socket.socket, str]) -> None:
    _sock, address = held_port
    message = refusal(address)
    assert "\n" not in message
    assert f"cannot listen on {address}" in message
    assert f"held by pid {os.getpid()}" in message


def test_taken_health_port_names_its_setting(held_port: tuple[socket.socket, str]) -> None:
    _sock, address = held_port
    message = refusal("127.0.0.1:0", health_listen=address)
    assert f"cannot listen on {address} (health_listen)" in message and "--health-listen" in message


def test_grpc_itself_binds_without_reuseport(held_port: tuple[socket.socket, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the one-line pre-check, gRPC's own bind must still refuse a port whose holder allows
    SO_REUSEPORT: gRPC's default would have joined it and shared its connections."""
    _sock, address = held_port
    monkeypatch.setattr(listeners, "bind_error", lambda _listen: "")
    assert f"cannot listen on {address}" in refusal(address)


def test_holder_lookup_reads_proc(held_port: tuple[socket.socket, str]) -> None:
    sock, _address = held_port
    port = sock.getsockname()[1]
    inodes = listeners.listening_inodes(port)
    assert os.fstat(sock.fileno()).st_ino in inodes
    assert os.getpid() in listeners.socket_owners(inodes)
    assert listeners.bind_error(f"127.0.0.1:{port}").startswith("address in use, held by pid")


def test_two_coordinators_cannot_serve_one_address(etcd: EtcdServer, coordinator: Coordinator,  # noqa: F811
                                                   tmp_path: Path, prefix: str) -> None:  # noqa: F811
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = Coordinator(etcd.url, second_dir, prefix + "other/", listen=coordinator.address)
    with pytest.raises(RuntimeError, match="did not start"):
        second.start()
    assert second.process is None  # it exited by itself; stop() reaped it
    log = (second_dir / "coordinator.log").read_text()
    assert coordinator.process is not None
    assert f"cannot listen on {coordinator.address} (listen): address in use, held by pid " \
           f"{coordinator.process.pid}" in log
    # The first one still serves, alone.
    with grpc.insecure_channel(coordinator.address) as channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).ListHosts(coordinator_pb2.ListHostsRequest(), timeout=5)
