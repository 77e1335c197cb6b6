"""What a user meets around the commands (issue 17, "Errors and conventions"): a version, a quiet
exit into a closed pipe, a drain of a host nobody knows refused. Against a real coordinator and
etcd where a command needs one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from holdfast.agent.service import VERSION
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.common import certs, serving, tls
from holdfast.common.tls import Role
from holdfast.coordinator.store import Store
from holdfast.localstack.etcd_server import free_port
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator, snapshot

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(120)

HOLDFAST = [sys.executable, "-m", "holdfast.cli"]


def test_version_as_flag_and_as_command() -> None:
    flag = subprocess.run([*HOLDFAST, "--version"], capture_output=True, text=True, timeout=30)
    assert flag.returncode == 0 and flag.stdout.startswith(f"holdfast {VERSION} ")
    command = subprocess.run([*HOLDFAST, "version"], capture_output=True, text=True, timeout=30)
    assert command.returncode == 0 and command.stdout == flag.stdout
    as_json = subprocess.run([*HOLDFAST, "version", "--json"], capture_output=True, text=True, timeout=30)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["version"] == VERSION


def into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """`holdfast ARGV | head -0`, deterministically: the reading end is closed before the command
    starts, so its first write to stdout meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*HOLDFAST, *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_a_closed_pipe_is_a_quiet_exit(coordinator: Coordinator, json_flag: tuple[str, ...]) -> None:
    done = into_closed_pipe("status", "--coordinator", coordinator.address, *json_flag)
    assert (done.returncode, done.stderr) == (141, "")
    assert (into_closed_pipe("version").returncode, into_closed_pipe("version").stderr) == (141, "")


def test_drain_of_a_host_nobody_knows_is_refused_and_writes_nothing(coordinator: Coordinator,
                                                                    prefix: str) -> None:
    etcd_url = coordinator.etcd_url
    before = snapshot(etcd_url, prefix)
    typo = subprocess.run([*HOLDFAST, "drain", "nosuchhost", "--coordinator", coordinator.address],
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 69, typo.stderr
    assert "HOST_NOT_REGISTERED" in typo.stderr and "no session names it" in typo.stderr
    assert "holdfast hosts" in typo.stderr and "--host-id" not in typo.stderr  # drain has no --host-id
    assert snapshot(etcd_url, prefix) == before
    # A registered host (its agent need not answer for a drain with nothing on it) is drained.
    reg = pb.HostRegistration(host_id="host-known", address="127.0.0.1:9",
                              spawn_token_env="HOLDFAST_SPAWN_TOKEN")
    with grpc.insecure_channel(coordinator.address) as channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).RegisterHost(
            pb.RegisterHostRequest(registration=reg, ttl_seconds=30), timeout=10)
    known = subprocess.run([*HOLDFAST, "drain", "host-known", "--json", "--coordinator",
                            coordinator.address], capture_output=True, text=True, timeout=60)
    assert known.returncode == 0 and json.loads(known.stdout)["draining"] is True, known.stderr
    # Undone, it says so, and nothing of handoffs (it said "handoff requested for 0 sessions").
    undone = subprocess.run([*HOLDFAST, "drain", "host-known", "--undo", "--coordinator",
                             coordinator.address], capture_output=True, text=True, timeout=60)
    assert undone.returncode == 0
    assert undone.stdout == "host host-known: no longer draining (grants there again)\n"


def test_nothing_listening_is_said_at_once(tmp_path: Path) -> None:
    """Issue 17: `run` with nothing listening took 5.8 s of retries to say UNREACHABLE."""
    address = f"127.0.0.1:{free_port()}"

    async def body() -> ClientError:
        async with Client(address, "host-x") as client:
            with pytest.raises(ClientError) as refused:
                await client.list_hosts()
            return refused.value

    error = asyncio.run(body())
    assert error.reason == "UNREACHABLE" and "nothing listens there" in error.message
    assert error.retried is False  # one try: nothing was waited for
    done = subprocess.run([*HOLDFAST, "run", "--session", "sess-nobody-01", "--coordinator", address,
                           "--", "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 69 and "nothing listens there" in done.stderr


def test_a_certificate_problem_says_it_is_one(tmp_path: Path) -> None:
    """Issue 17: a TLS handshake failure (another CA) was reported as "no coordinator"."""
    certs.init_local(tmp_path / "ours", [], ["127.0.0.1"])
    certs.init_local(tmp_path / "theirs", [], ["127.0.0.1"])

    async def body() -> list[ClientError]:
        server = await serving.start("127.0.0.1:0", "test.Service", lambda _server: None,
                                     tls.server_credentials(tmp_path / "ours", Role("coordinator")))
        errors = []
        try:
            for tls_dir in (tmp_path / "theirs", None):
                async with Client(server.address, "host-x", tls_dir) as client:
                    with pytest.raises(ClientError) as refused:
                        await client.list_hosts()
                    errors.append(refused.value)
        finally:
            await serving.drain(server, 0)
        return errors

    wrong_ca, plaintext = asyncio.run(body())
    assert (wrong_ca.reason, wrong_ca.exit_code, wrong_ca.retried) == ("TLS_HANDSHAKE_FAILED", 77, False)
    assert "certificate problem" in str(wrong_ca)
    assert (plaintext.reason, plaintext.retried) == ("TLS_REQUIRED", False)  # it answered in TLS: no retry
    assert "pass --tls-dir" in plaintext.next_step


def test_hosts_and_status_show_which_hosts_are_draining(coordinator: Coordinator, prefix: str) -> None:
    """Issue 17: draining was not shown by `hosts`/`status`. A drained host keeps its flag when its
    registration lapses (its agent down for the maintenance): it is listed as not registered."""
    with grpc.insecure_channel(coordinator.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        for host_id in ("host-up", "host-maint", "host-gone"):
            reg = pb.HostRegistration(host_id=host_id, address="127.0.0.1:9",
                                      spawn_token_env="HOLDFAST_SPAWN_TOKEN")
            stub.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=30), timeout=10)
    for host_id in ("host-maint", "host-gone"):
        drained = subprocess.run([*HOLDFAST, "drain", host_id, "--coordinator", coordinator.address],
                                 capture_output=True, text=True, timeout=60)
        assert drained.returncode == 0, drained.stderr

    async def lapse() -> None:  # as the etcd lease of a stopped agent would
        store = Store.connect(coordinator.etcd_url, prefix=prefix)
        try:
            await store.txn([], [], [store.key("hosts", "host-gone")])
        finally:
            await store.close()

    asyncio.run(lapse())

    def cli(*argv: str) -> str:
        done = subprocess.run([*HOLDFAST, *argv, "--coordinator", coordinator.address],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(cli("hosts", "--json"))
    assert {h["host_id"]: h["draining"] for h in listed["hosts"]} == {"host-up": False, "host-maint": True}
    assert listed["draining"] == ["host-gone", "host-maint"]
    status = json.loads(cli("status", "--json"))
    assert (status["draining"], status["hosts"]) == (listed["draining"], listed["hosts"])
    for text in (cli("hosts"), cli("status")):
        rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("host-")}
        assert rows["host-up"][-1] == "no" and rows["host-maint"][-1] == "yes"
        assert rows["host-gone"][-3:] == ["not", "registered", "yes"]
    assert "3 hosts" not in cli("status") and "2 hosts, 2 draining" in cli("status")
    # Undone, it is gone from both.
    subprocess.run([*HOLDFAST, "drain", "host-gone", "--undo", "--coordinator", coordinator.address],
                   check=True, capture_output=True, timeout=60)
    assert json.loads(cli("hosts", "--json"))["draining"] == ["host-maint"]
