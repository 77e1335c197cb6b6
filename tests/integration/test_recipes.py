"""docs/recipes.md, run as written: the Codex and Claude Code recipes across two simulated hosts
sharing one home (the stand-ins in tests/integration/standins keep state where the real CLIs do).
Host 1 starts the conversation and records its handle; host 2 takes the session over and resumes
that same conversation — one transcript, two turns, never two writers."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.integration.run_fixtures import Cluster

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
