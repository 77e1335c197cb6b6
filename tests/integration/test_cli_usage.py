"""CLI: bad arguments are usage errors (exit 2) that change nothing; no coordinator is exit 69."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from holdfast.cli.main import main
from holdfast.localstack.etcd_server import free_port


@pytest.mark.parametrize("argv", [
    [],
    ["no-such-command"],
    ["run", "--session", "my-session-01"],                           # no CMD
    ["run", "--session", "my-session-01", "--"],                     # empty CMD
    ["run", "--session", "short", "--", "true"],                     # malformed session id
    ["run", "--session", "my-session-01", "--force", "--", "true"],  # --force without --takeover
    ["run", "--session", "my-session-01", "--wait", "-1", "--", "true"],
    ["run", "--session", "my-session-01", "--grace", "soon", "--", "true"],
    ["run", "--", "true"],                                           # no --session
    ["show"],
    ["show", "bad id!"],
    ["probe"],
    ["recover", "my-session-01", "--reason", "gone"],                # no --fence
    ["recover", "my-session-01", "--fence", "0", "--reason", "gone"],
    ["recover", "my-session-01", "--fence", "x", "--reason", "gone"],
    ["status", "--bogus"],
    ["hosts", "extra"],
    ["get"],
    ["put"],
    ["exec", "--", "true"],                                          # no --host
    ["exec", "--host", "1"],                                         # no CMD
    ["up", "--hosts", "-1"],
    ["up", "--hosts", "many"],
])
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_put_outside_a_run_is_a_usage_error_naming_the_way(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HOLDFAST_GRANT_FILE", raising=False)
    assert main(["put", "key", "value", "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["error"]["reason"] == "INVALID_ARGUMENT"
    assert "holdfast run" in out.err


def test_no_coordinator_is_exit_69_with_the_next_step() -> None:
    address = f"127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", "status", "--json",
                           "--coordinator", address], capture_output=True, text=True, timeout=60)
    assert done.returncode == 69
    error = json.loads(done.stdout)["error"]
    assert error["reason"] == "UNREACHABLE" and "holdfast up" in error["next_step"]


def test_a_provider_name_the_coordinator_refuses_is_refused_before_a_takeover_keeps_anything(
        tmp_path: Path) -> None:
    """`run --takeover --provider` with a name longer than an Acquire takes: the takeover's
    operation id was kept (its state directory made) before the coordinator refused the Acquire,
    or — as here, with none listening — before the run found no coordinator (69)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", "run", "--session", "my-session-01",
                           "--coordinator", f"127.0.0.1:{free_port()}", "--takeover", "--provider", "p" * 129,
                           "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "provider is 129 characters; the limit is 128" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("argv,wanted", [
    (["run", "--help"], ["8 to 128 letters", "examples:", "exit status:", "127 CMD not found"]),
    (["get", "--help"], ["8 to 128 letters"]),
    (["exec", "--help"], ["1..N of `holdfast up --hosts N`", "--state-dir STATE_DIR"]),
    (["up", "--help"], ["One `up` per state directory"]),
    (["probe", "--help"], ["0 free", "3 held", "4 unknown"]),
])
def test_help_says_what_a_user_needs(argv: list[str], wanted: list[str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17: --session, exec --host and up had no help text; no command showed its exit codes."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width
    for phrase in wanted:
        assert " ".join(phrase.split()) in text, (argv, phrase)
