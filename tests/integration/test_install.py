"""The package as operators install it: the wheel scripts/wheel builds, installed with no extra into a
clean venv on Debian's python3 outside the repository, is the client. Its `holdfast run` (and `put`
from inside CMD) works against a coordinator and an agent this repository's venv serves; it holds
none of the servers' dependencies, and each server command says which extra to install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")]
ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"  # the base install's dependencies (scripts/setup)
# What only servers need (pyproject.toml's extras): none of it in a client's venv.
SERVER_ONLY = {"aetcd", "kubernetes", "cryptography", "prometheus-client", "grpcio-health-checking",
               "grpcio-reflection"}


def outside_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would lead the clean venv back to the repository."""
    drop = ("HOLDFAST_", "PYTHON", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean venv's bin directory, with the wheel installed offline and without any extra."""
    tmp = tmp_path_factory.mktemp("install")
    built = subprocess.run([str(ROOT / "scripts" / "wheel"), str(tmp / "dist")], capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    (wheel,) = built.stdout.split()
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    installed = subprocess.run([str(tmp / "venv" / "bin" / "pip"), "install", "-q", "--no-index",
                                "--find-links", str(WHEELHOUSE), wheel], capture_output=True, text=True,
                               timeout=120, cwd=tmp, env=outside_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert installed.returncode == 0, installed.stderr + "\n(run ./scripts/setup: it fills .venv/wheelhouse)"
    return tmp / "venv" / "bin"


def test_the_base_install_is_the_client_without_any_server_dependency(client: Path) -> None:
    listed = subprocess.run([str(client / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True, timeout=60, env=outside_env())
    names = {line.split("==")[0].lower().replace("_", "-") for line in listed.stdout.split()}
    assert "holdfast-sessions" in names and not names & SERVER_ONLY, names & SERVER_ONLY
    where = subprocess.run([str(client / "python"), "-c", "import holdfast.cli as c; print(c.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60, env=outside_env(), cwd="/")
    assert where.stdout.startswith(str(client.parent)), where.stdout


@pytest.mark.parametrize("argv,extra", [
    (["coordinator", "serve", "--etcd", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"], "coordinator"),
    (["agent", "serve", "--listen", "127.0.0.1:0", "--host-id", "h"], "agent"),
    (["up", "--hosts", "1"], "server"),
    (["certs", "init", "/nonexistent/pki"], "certs"),
])
def test_a_command_the_base_install_cannot_run_names_its_extra(client: Path, argv: list[str],
                                                                extra: str) -> None:
    done = subprocess.run([str(client / "holdfast"), *argv], capture_output=True, text=True, timeout=60,
                          env=outside_env(), cwd="/")
    assert done.returncode == 78, done.stderr
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith(f"holdfast: `holdfast {argv[0]}` needs ")
    assert line.endswith(f"pip install 'holdfast-sessions[{extra}]'"), line


def test_run_of_the_base_install_against_a_stack_served_from_the_repository(
        client: Path, coordinator: Coordinator, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "install-host", args=["--coordinator", coordinator.address])
    try:
        env = outside_env(HOLDFAST_HOST_ID="install-host", HOLDFAST_COORDINATOR=coordinator.address,
                          XDG_STATE_HOME=str(tmp_path / "state"), TMPDIR=str(tmp_path),
                          PATH=f"{client}:{os.environ['PATH']}")
        # CMD's `holdfast` is the clean venv's too (first on PATH): a fenced write through the grant.
        done = subprocess.run([str(client / "holdfast"), "run", "--session", "install-01", "--", "sh", "-c",
                               'holdfast put written yes && echo "ran $(command -v holdfast)"'],
                              capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path),
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == f"ran {client / 'holdfast'}"
        got = subprocess.run([str(client / "holdfast"), "get", "--session", "install-01", "written"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert got.returncode == 0 and got.stdout.strip() == "yes", got.stdout + got.stderr
    finally:
        agent.stop()
    with grpc.insecure_channel(coordinator.address) as channel:
        record = coordinator_pb2_grpc.CoordinatorStub(channel).GetSession(
            pb.GetSessionRequest(session_id="install-01"), timeout=10).record
    assert record.lease.claim_status == pb.RELEASED and record.lease.fence == 1
