"""What a newcomer meets first: a watch that fails as `status` fails when it never connected, and
says so when it loses the coordinator later; completion of the ids a coordinator knows. Against real
coordinators and etcd."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from holdfast.common import certs, serving, tls
from holdfast.common.tls import Role
from holdfast.localstack.etcd_server import free_port
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import signals_as_at_a_terminal
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(120)

HOLDFAST = [sys.executable, "-m", "holdfast.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any HOLDFAST_ variable of the caller's (nor its state directory)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}, **extra}


async def cli_beside_tls_server(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    """`holdfast ARGV --coordinator A` run while a gRPC server on mTLS listens at A (certificates
    in tmp_path/ours; the CLI presents tmp_path/theirs, another CA's): (exit code, stdout, stderr)."""
    for name in ("ours", "theirs"):
        certs.init_local(tmp_path / name, [], ["127.0.0.1"])
    server = await serving.start("127.0.0.1:0", "test.Service", lambda _server: None,
                                 tls.server_credentials(tmp_path / "ours", Role("coordinator")))
    try:
        env = clean_env(HOLDFAST_TLS_DIR=str(tmp_path / "theirs"))
        proc = await asyncio.create_subprocess_exec(*HOLDFAST, *argv, "--coordinator", server.address,
                                                    env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()
    finally:
        await serving.drain(server, 0)


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_a_watch_that_never_connected_fails_as_status_does(tmp_path: Path,
                                                           json_flag: tuple[str, ...]) -> None:
    """Nothing listening: 69; another CA: 77 — at once, the table's header never printed (it
    retried silently forever, and Ctrl-C then exited 0)."""
    nobody = subprocess.run([*HOLDFAST, "status", "--watch", *json_flag, "--coordinator",
                             f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60,
                            env=clean_env())
    wrong_ca = asyncio.run(cli_beside_tls_server(tmp_path, "status", "--watch", *json_flag))
    for (code, out, err), expected in (((nobody.returncode, nobody.stdout, nobody.stderr), 69),
                                       (wrong_ca, 77)):
        assert code == expected, err
        assert not out.startswith("SESSION") and err.startswith("holdfast: ")
        assert ('"error"' in out) == bool(json_flag)
    # One line: gRPC's C core no longer logs its own "Handshake failed" before it.
    assert wrong_ca[2].count("\n") == 1 and wrong_ca[2].startswith("holdfast: TLS_HANDSHAKE_FAILED: ")


def test_a_watch_says_when_it_lost_the_coordinator_and_reconnects(coordinator: Coordinator) -> None:
    with signals_as_at_a_terminal():  # Ctrl-C must reach it, as at a terminal
        watch = subprocess.Popen([*HOLDFAST, "status", "-w", "--coordinator", coordinator.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert watch.stdout is not None and watch.stderr is not None
        assert watch.stdout.readline().split()[:2] == ["SESSION", "HOST"]  # connected: then the header
        coordinator.stop()
        assert watch.stderr.readline().rstrip().endswith("; reconnecting")
        coordinator.start()  # on the same address
        watch.send_signal(signal.SIGINT)  # Ctrl-C ends a watch that had connected quietly, with 0
        assert watch.wait(30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def test_completion_offers_the_coordinators_ids_and_nothing_when_none_answers(coordinator: Coordinator,
                                                                             tmp_path: Path) -> None:
    reg = pb.HostRegistration(host_id="host-completed", address="127.0.0.1:9",
                              spawn_token_env="HOLDFAST_SPAWN_TOKEN")
    with grpc.insecure_channel(coordinator.address) as channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).RegisterHost(
            pb.RegisterHostRequest(registration=reg, ttl_seconds=30), timeout=10)

    def ids(kind: str, address: str) -> tuple[int, str, str]:
        env = clean_env(HOLDFAST_COORDINATOR=address, XDG_STATE_HOME=str(tmp_path))
        done = subprocess.run([*HOLDFAST, "completion", "--ids", kind], capture_output=True, text=True,
                              timeout=60, env=env)
        return done.returncode, done.stdout, done.stderr

    assert ids("hosts", coordinator.address) == (0, "host-completed\n", "")
    assert ids("sessions", coordinator.address) == (0, "", "")  # none yet
    # Nothing listening: nothing offered, nothing said (a completion must not print errors).
    assert ids("hosts", f"127.0.0.1:{free_port()}") == (0, "", "")
