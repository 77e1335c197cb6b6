"""docs/recipes.md, run as written: the Codex and Claude Code recipes across two simulated hosts
sharing one home (the stand-ins in tests/integration/standins keep state where the real CLIs do).
Host 1 starts the conversation and records its handle; host 2 takes the session over and resumes
that same conversation — one transcript, two turns, never two writers."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
STANDINS = Path(__file__).resolve().parent / "standins"


def recipe(provider: str) -> str:
    """The shell program of the recipe for `--provider PROVIDER`, exactly as the docs give it."""
    found = re.search(rf"```\nholdfast run --session \"\$S\" --provider {provider} -- sh -c '\n(.*?)'\n```",
                      RECIPES.read_text(), re.S)
    assert found, f"docs/recipes.md has no {provider} recipe"
    return found[1]


@pytest.mark.parametrize("provider,state", [("codex", "CODEX_HOME"), ("claude-code", "CLAUDE_CONFIG_DIR")])
def test_the_next_host_resumes_the_same_conversation(cluster: Cluster, tmp_path: Path, provider: str,
                                                     state: str) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid, home = f"sess-recipe-{provider}", tmp_path / "shared-home"
    bin_dir = os.path.dirname(sys.executable)  # `holdfast` itself, as the recipe calls it
    env = {state: str(home), "PATH": f"{STANDINS}:{bin_dir}:/usr/bin:/bin", "S": sid}
    first = cluster.run(a, sid, "--provider", provider, cmd=["sh", "-c", recipe(provider)],
                        env={**env, "PROMPT": "turn one"})
    assert first.wait(30) == 0, first.err()
    chain = cluster.record(sid).record.provider_handle_chain
    assert len(chain) == 1 and chain[0].minted_at_fence == 1
    second = cluster.run(b, sid, "--provider", provider, "--takeover", cmd=["sh", "-c", recipe(provider)],
                         env={**env, "PROMPT": "turn two"})
    assert second.wait(30) == 0, second.err()
    transcripts = [p for p in home.rglob("*.jsonl")]
    assert len(transcripts) == 1 and chain[0].handle in transcripts[0].name
    turns = [json.loads(line)["prompt"] for line in transcripts[0].read_text().splitlines()]
    assert turns == ["turn one", "turn two"], "host 2 resumed host 1's conversation"
    assert cluster.record(sid).record.lease.fence == 2


@pytest.fixture
def two_mounts(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """One directory seen through two separate FUSE mounts (bindfs), as two hosts see one shared
    home: the kernel keeps flocks per mount, so one host's lock does not exclude the other's. Made
    before the simulated hosts start (each copies the mount table when its namespace is made)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine: a shared home through FUSE mounts cannot be made")
    shared, mounts = tmp_path / "shared", [tmp_path / "mount-1", tmp_path / "mount-2"]
    made: list[Path] = []
    for path in (shared, *mounts):
        path.mkdir()
    try:
        for mount in mounts:
            subprocess.run(["bindfs", "--no-allow-other", str(shared), str(mount)], check=True, timeout=30)
            made.append(mount)
        yield shared, mounts[0], mounts[1]
    finally:
        for mount in made:
            subprocess.run(["fusermount", "-u", "-z", str(mount)], check=False, timeout=30)


def test_on_a_shared_home_holdfast_is_the_lock_that_holds(two_mounts: tuple[Path, Path, Path],
                                                           cluster: Cluster) -> None:
    shared, mount_1, mount_2 = two_mounts
    # What a per-host lock (Codex's thread-writer lock file) meets on such a home: no exclusion.
    first_lock = os.open(mount_1 / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    second_lock = os.open(mount_2 / "writer.lock", os.O_RDWR)
    try:
        fcntl.flock(first_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(second_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # granted: the mounts do not share it
    finally:
        os.close(first_lock)
        os.close(second_lock)
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-shared-home"
    bin_dir = os.path.dirname(sys.executable)
    env = {"PATH": f"{STANDINS}:{bin_dir}:/usr/bin:/bin", "S": sid}
    # Host 1's writer stays on after its turn (the recipe, then it keeps working).
    stays = recipe("claude-code").replace("exec claude", "claude") + "; exec sleep 600"
    live = cluster.run(a, sid, "--provider", "claude-code", "--grace", "2", cmd=["sh", "-c", stays],
                       env={**env, "CLAUDE_CONFIG_DIR": str(mount_1), "PROMPT": "turn one"})
    until("host 1's turn", lambda: list(shared.rglob("*.jsonl")))
    plain = ["sh", "-c", recipe("claude-code")]
    refused = cluster.run(b, sid, "--provider", "claude-code", cmd=plain,
                          env={**env, "CLAUDE_CONFIG_DIR": str(mount_2), "PROMPT": "not while host 1 writes"})
    assert refused.wait(30) == 75 and "HELD" in refused.err()
    taker = cluster.run(b, sid, "--provider", "claude-code", "--takeover", cmd=plain,
                        env={**env, "CLAUDE_CONFIG_DIR": str(mount_2), "PROMPT": "turn two"})
    assert taker.wait(60) == 0, taker.err()
    # Host 1's run ended its tree on the handoff request: its sleep died of SIGTERM (143).
    assert live.wait(30) == 143 and "handoff requested by host host-b" in live.err(), live.err()
    transcripts = list(shared.rglob("*.jsonl"))
    assert len(transcripts) == 1
    assert [json.loads(line)["prompt"] for line in transcripts[0].read_text().splitlines()] == [
        "turn one", "turn two"]
