"""`holdfast codex` and `holdfast claude` write nothing when refused: the CLI's state directory is
made only once the session is granted (a run refused HELD left `~/.codex` behind), and checked
before anything is asked; `run`'s options that do not go together are refused before anything is
made or asked (stand-ins for the CLIs: tests/integration/standins)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import grpc
import pytest

from holdfast.client.acquire import RunSpec
from holdfast.client.connection import OWNED, Client
from holdfast.client.errors import ClientError
from holdfast.client.owner import Owner
from holdfast.common.reasons import Reason
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = pytest.mark.timeout(120)
STANDINS = Path(__file__).resolve().parent / "standins"
PATH = f"{STANDINS}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
# Each command's state directory below HOME, and the directory of what it carries.
MADE = {"codex": (".codex", ".codex"), "claude": (".claude", ".claude/projects")}


def owned(cluster: Cluster, session: str) -> bool:
    try:
        return cluster.record(session).record.lease.claim_status in OWNED
    except grpc.RpcError:  # no record yet
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")
@pytest.mark.parametrize("command", ["codex", "claude"])
def test_a_refused_run_leaves_no_state_directory_and_a_granted_one_makes_it(
        cluster: Cluster, tmp_path: Path, command: str) -> None:
    host = cluster.host("host-a")
    held, free = f"sess-held-{command}", f"sess-free-{command}"
    holder = cluster.run(host, held, cmd=["sleep", "600"])
    until("the holder's grant", lambda: owned(cluster, held))
    home = tmp_path / "x" / "home"
    home.mkdir(parents=True)
    env = {"HOME": str(home), "PATH": PATH, "PROMPT": "hello"}
    refused = cluster.run(host, held, command=command, cmd=["hello"], env=env)
    assert refused.wait(60) == 75 and "HELD" in refused.err(), refused.err()
    assert list(home.iterdir()) == [], "a refused run makes nothing"
    assert holder.proc.poll() is None
    # In /, which the stand-in keys as Claude Code does (it makes `-` of `/` alone).
    granted = cluster.run(host, free, command=command, cmd=["hello"], env=env)
    assert granted.wait(60) == 0, granted.err()
    state, made = MADE[command]
    assert (home / made).is_dir() and (home / state).stat().st_mode & 0o777 == 0o755, "made once granted"
    assert list((home / made).rglob("*.jsonl")), "the CLI's first turn was written there"
    copy = cluster.stub.GetCarry(pb.GetCarryRequest(session_id=free), timeout=10)
    assert copy.found and any(e.path.endswith(".jsonl") for e in copy.manifest.entries), (
        "carried: its directory was there when the CLI started, as made", granted.err())
    assert len(cluster.record(free).record.provider_handle_chain) == 1


def test_options_that_do_not_go_together_are_refused_before_anything_is_asked(tmp_path: Path) -> None:
    """`--force` without `--takeover`: `holdfast claude` asked the coordinator for the session's
    working directory first (69 with none there), and `holdfast codex` made its state directory."""
    home = tmp_path / "home"
    home.mkdir()
    for command in ("claude", "codex"):
        done = subprocess.run([sys.executable, "-m", "holdfast.cli", command, "--session", "sess-abcdefgh",
                               "--coordinator", "127.0.0.1:9", "--force", "--", "hi"],
                              env={**os.environ, "HOME": str(home), "PATH": PATH}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "--force needs --takeover" in done.stderr, done.stderr
    assert list(home.iterdir()) == []


def test_a_library_run_checks_what_it_makes_once_granted_before_anything_is_asked(tmp_path: Path) -> None:
    """RunSpec.made_at_grant in a directory others may change: refused before the client is used
    at all (here it is none), nothing made."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    spec = RunSpec("sess-abcdefgh", ["true"], made_at_grant=[str(shared / "state")])
    with pytest.raises(ClientError, match="nothing was made, nor a grant asked for") as refused:
        asyncio.run(Owner.start(cast(Client, None), spec))
    assert refused.value.reason == Reason.INVALID_ARGUMENT and list(shared.iterdir()) == []
