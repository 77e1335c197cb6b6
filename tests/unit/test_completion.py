"""`holdfast completion bash` completes every subcommand and option of the parser, evaluated by a
real bash (issue 17: no shell completion)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess

import pytest

from holdfast.cli import completion
from holdfast.cli.main import build_parser

# A `holdfast` on PATH that answers `completion --ids` as a coordinator with these would.
STUB = """#!/bin/sh
[ "$1 $2 $3" = "completion --ids sessions" ] && printf 'sess-alpha-01\\nsess-beta-002\\n'
[ "$1 $2 $3" = "completion --ids hosts" ] && printf 'host-one\\nhost-two\\n'
exit 0
"""


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("stub")
    (directory / "holdfast").write_text(STUB)
    (directory / "holdfast").chmod(0o755)
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


def complete(*words: str, shell: str = "bash", path: str | None = None) -> set[str]:
    """What SHELL offers after `holdfast WORDS...` (the last word is the one being completed)."""
    script = completion.SCRIPTS[shell](build_parser())
    env = {**os.environ, **({"PATH": path} if path else {})}
    if shell == "fish":  # fish completes a command line itself
        line = " ".join(("holdfast", *words))
        done = subprocess.run(["fish", "--no-config", "-c", f"{script}\ncomplete -C {shlex.quote(line)}"],
                              capture_output=True, text=True, timeout=30, check=True, env=env)
        return {row.split("\t")[0] for row in done.stdout.splitlines()}
    line = " ".join(f"'{w}'" for w in ("holdfast", *words))
    call = "_holdfast" if shell == "bash" else "emulate sh -c _holdfast"  # as bashcompinit calls it
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; {call}\n"
             'printf "%s\\n" "${COMPREPLY[@]}"')
    argv = ["bash", "-c", probe] if shell == "bash" else ["zsh", "-f", "-c", probe]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True, env=env)
    # bashcompinit's compgen leaves the matching to zsh, which offers what starts as typed.
    return {word for word in done.stdout.split() if word.startswith(words[-1] if words else "")}


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
    assert complete("completion", "") == {"bash", "zsh", "fish", "--ids", "-h", "--help"}


def test_session_and_host_ids_come_from_the_coordinator_where_an_id_is_typed(stub_path: str) -> None:
    sessions, hosts = {"sess-alpha-01", "sess-beta-002"}, {"host-one", "host-two"}
    assert sessions <= complete("show", "", path=stub_path)
    assert complete("run", "--session", "", path=stub_path) == sessions
    assert complete("run", "--session", "sess-b", path=stub_path) == {"sess-beta-002"}
    assert complete("get", "--session", "", path=stub_path) == sessions
    assert hosts <= complete("drain", "", path=stub_path)
    assert complete("admin", "recover-host", "host-t", path=stub_path) == {"host-two"}
    assert complete("run", "--host-id", "", path=stub_path) == hosts
    assert not sessions & complete("status", "", path=stub_path)  # no id is typed there
    assert complete("show", "--", path=stub_path) <= {"--help", "--coordinator", "--tls-dir", "--json"}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_complete_as_bash_does(shell: str, stub_path: str) -> None:
    assert shutil.which(shell), f"{shell} is missing: ./scripts/setup installs it"
    for words in (("st",), ("admin", ""), ("run", "--re"), ("run", "--session", ""), ("drain", "h"),
                  ("show", "sess-a"), ("agent", "doctor", "--no")):
        assert complete(*words, shell=shell, path=stub_path) == complete(*words, path=stub_path), words
