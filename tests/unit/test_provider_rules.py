"""The provider rules (client/provider_rules.py) against what the real CLIs gave, recorded in
tests/unit/samples/ from npm `@openai/codex` 0.171.0 and `@anthropic-ai/claude-code` 2.1.332 run
against tests/clis/stub_model.py: Codex's `exec --json` events, Claude Code's project directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from holdfast.client import provider_rules as rules

SAMPLES = Path(__file__).with_name("samples")
CODEX, CLAUDE = rules.PROVIDERS["codex"], rules.PROVIDERS["claude"]


def test_the_handle_is_codex_s_thread_started_event_and_nothing_else() -> None:
    first = (SAMPLES / "codex-exec-json-first-run.jsonl").read_bytes().splitlines()
    thread = "01a24394-af02-7c81-b8aa-7915554f6c50"
    assert [rules.thread_started(line) for line in first] == [thread, "", "", "", ""]
    resumed = (SAMPLES / "codex-exec-json-resume.jsonl").read_text().splitlines()
    assert rules.thread_started(resumed[0]) == thread, "a resume names the same thread"


@pytest.mark.parametrize("line", [
    "not json", "[]", '{"type":"thread.started"}', '{"type":"thread.started","thread_id":"../x"}',
    '{"type":"thread.started","thread_id":7}',
    '{"type":"item.completed","item":{"type":"agent_message","text":"{\\"type\\":\\"thread.started\\"}"}}',
])
def test_nothing_else_is_taken_for_a_handle(line: str) -> None:
    assert rules.thread_started(line) == ""


def test_claude_s_project_directory_is_the_cwd_key_long_paths_and_emoji_included() -> None:
    recorded = json.loads((SAMPLES / "claude-project-dirs.json").read_text())
    assert any(len(r["project_dir"]) > rules.CLAUDE_KEY_MAX for r in recorded)
    for r in recorded:
        assert rules.claude_cwd_key(r["cwd"]) == r["project_dir"]


def test_only_what_resume_needs_is_carried() -> None:
    env = {"HOME": "/home/u"}
    assert rules.carried_path(CODEX, rules.state_dir(CODEX, env), "/w") == "/home/u/.codex/sessions"
    assert rules.carried_path(CODEX, rules.state_dir(CODEX, {"CODEX_HOME": "/c"}), "/w") == "/c/sessions"
    assert rules.carried_path(CLAUDE, rules.state_dir(CLAUDE, env), "/w/my app") == \
        "/home/u/.claude/projects/-w-my-app"
    assert rules.state_dir(CLAUDE, {"CLAUDE_CONFIG_DIR": "/cc", "HOME": "/h"}) == "/cc"


def test_codex_is_started_then_resumed_outside_a_git_repository() -> None:
    thread = "01a24394-af02-7c81-b8aa-7915554f6c50"
    assert rules.codex_argv("/bin/codex", "", ["-m", "m", "hi"]) == [
        "/bin/codex", "exec", "--json", "--skip-git-repo-check", "-m", "m", "hi"]
    assert rules.codex_argv("/bin/codex", thread, ["hi"]) == [
        "/bin/codex", "exec", "--json", "--skip-git-repo-check", "resume", thread, "hi"]


def test_claude_starts_under_the_id_recorded_first_then_resumes_it() -> None:
    sid = "6b7a6d4e-6c1b-4f53-9a43-7a0a3f2e1c11"
    claude = "/bin/claude"
    assert rules.claude_argv(claude, "", sid, ["hi"]) == [claude, "-p", "--session-id", sid, "hi"]
    assert rules.claude_argv(claude, sid, "", ["hi"]) == [claude, "-p", "--resume", sid, "hi"]


@pytest.mark.parametrize("handle", ["--last", "x", "6b7a6d4e-6c1b-4f53-9a43-7a0a3f2e1c11\n", "-h"])
def test_a_handle_the_cli_does_not_give_is_refused_before_any_cli_runs(handle: str) -> None:
    with pytest.raises(rules.ProviderRefused, match="not a thread id"):
        rules.codex_argv("/bin/codex", handle, [])
    with pytest.raises(rules.ProviderRefused, match="not a thread id"):
        rules.claude_argv("/bin/claude", handle, "", [])


def test_a_claude_resume_from_another_directory_is_refused_naming_the_recorded_one() -> None:
    rules.check_cwd("", "/anywhere")  # a first run records its own
    rules.check_cwd("/w/app", "/w/app")
    with pytest.raises(rules.ProviderRefused, match=r"kept for the working directory /w/app.*cd /w/app"):
        rules.check_cwd("/w/app", "/w/other")
