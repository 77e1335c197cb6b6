"""`holdfast completion bash` completes every subcommand and option of the parser, evaluated by a
real bash (issue 17: no shell completion)."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from holdfast.cli import completion
from holdfast.cli.main import build_parser


def complete(*words: str) -> set[str]:
    """What bash offers after `holdfast WORDS...` (the last word is the one being completed)."""
    script = completion.bash_script(build_parser())
    line = " ".join(f"'{w}'" for w in ("holdfast", *words))
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _holdfast\n"
             'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    return set(done.stdout.split())


def subcommands(parser: argparse.ArgumentParser) -> set[str]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_every_subcommand_is_completed_at_every_level() -> None:
    parser = build_parser()
    top = subcommands(parser)
    assert {"run", "status", "hosts", "drain", "up", "agent", "admin", "completion", "version"} <= top
    assert complete("") == top | {"-h", "--help", "--version"}
    assert complete("st") == {"status"}
    for group in ("agent", "admin", "certs", "coordinator"):
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert subcommands(sub.choices[group]) <= complete(group, ""), group


def test_options_follow_the_command_and_nothing_after_double_dash() -> None:
    run = complete("run", "--")
    assert {"--session", "--report", "--takeover", "--force", "--wait", "--coordinator"} <= run
    assert "--undo" not in run and "--undo" in complete("drain", "--")
    assert "--node" in complete("agent", "doctor", "--")
    # A value that happens to be a command's name does not move to that command.
    assert "--report" in complete("run", "--session", "status", "--re")
    assert complete("run", "--session", "s-12345678", "--", "") == set()
    assert complete("completion", "") == {"bash", "-h", "--help"}
