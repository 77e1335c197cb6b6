"""cli.main.COMMANDS, the map that lets `holdfast run` import only its own module, stays equal to
what each module registers: a command missing from it would vanish from the fast path, and one
mapped to the wrong module would fail to parse. And `run`'s import set stays free of what only
other parts, or only a failure, need (each was milliseconds of every start: docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from holdfast.cli import main


def commands_of(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_command_is_mapped_to_the_module_that_registers_it() -> None:
    assert commands_of(main.build_parser()) == {*main.COMMANDS, "version", "completion"}
    for command, module in main.COMMANDS.items():
        same_module = {name for name, owner in main.COMMANDS.items() if owner == module}
        if hasattr(importlib.import_module(module), f"register_{command}"):  # registered alone
            same_module = {command}
        assert commands_of(main.build_parser(command)) == {"version", *same_module}, command


def test_run_builds_its_own_parser_alone() -> None:
    """Each of the module's other commands was argparse set-up (gettext's lookups on disk
    included) on every `run`'s start."""
    assert commands_of(main.build_parser("run")) == {"version", "run"}


def test_a_known_command_parses_the_same_on_the_fast_path() -> None:
    argv = ["run", "--session", "session-0001", "--", "true"]
    fast, full = main.build_parser("run").parse_args(argv), main.build_parser().parse_args(argv)
    assert vars(fast).keys() == vars(full).keys()
    assert {k: v for k, v in vars(fast).items() if k not in ("handler", "parser")} == \
        {k: v for k, v in vars(full).items() if k not in ("handler", "parser")}


# Only the coordinator (aetcd), the agent (prometheus_client, ctypes), a server's certificate check
# (cryptography), a failed call (grpc_status), a --guard (sqlite3 and the stores' module) or the
# tree's end (the /proc scan) needs these; random hex is os.urandom's, not `secrets`' (which brings
# hmac); protobuf's pure-Python message module (with text_format) is deferred on upb
# (holdfast/v1/__init__.py); carried state only with --carry or `show`; the operator's name
# (getpass) only for the commands that record it; the completion script only for itself.
NOT_ON_RUNS_PATH = ("aetcd", "prometheus_client", "cryptography", "ctypes", "grpc_status", "sqlite3",
                    "tenacity", "platform", "google.protobuf.json_format", "holdfast.agent",
                    "holdfast.coordinator", "holdfast.localstack", "holdfast.proc.scan", "secrets",
                    "hmac", "google.protobuf.text_format", "google.protobuf.internal.decoder",
                    "holdfast.client.guards", "holdfast.client.carry", "holdfast.common.carry_rules",
                    "getpass", "holdfast.cli.completion")


def test_run_imports_nothing_it_does_not_need_before_cmd_runs() -> None:
    program = ("import json, sys; import holdfast.cli.main as m, holdfast.cli.run_commands; "
               "m.build_parser('run').parse_args(['run', '--session', 'session-0001', '--', 'true']); "
               "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", program], check=True, capture_output=True,
                                       text=True).stdout)
    assert "holdfast.client.owner" in loaded  # the probe imported what `run` runs
    heavy = [name for name in loaded if name.startswith(NOT_ON_RUNS_PATH)]
    assert heavy == []


def test_grpc_settings_hold_only_while_the_command_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC's C core reads GRPC_VERBOSITY and GRPC_EXPERIMENTS when it is imported (its "Handshake
    failed" line came before the CLI's own); CMD and every child get the environment as it was,
    and a user's own value stands."""
    for name in main.GRPC_IMPORT_ENV:
        monkeypatch.delenv(name, raising=False)
    with main.grpc_settings():
        inside = {name: os.environ.get(name) for name in main.GRPC_IMPORT_ENV}
    assert inside == main.GRPC_IMPORT_ENV
    assert inside["GRPC_VERBOSITY"] == "NONE"
    assert not set(main.GRPC_IMPORT_ENV) & set(os.environ)
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    with main.grpc_settings():
        assert (os.environ["GRPC_VERBOSITY"], os.environ["GRPC_EXPERIMENTS"]) == (
            "DEBUG", main.GRPC_IMPORT_ENV["GRPC_EXPERIMENTS"])
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG" and "GRPC_EXPERIMENTS" not in os.environ


def test_grpc_is_imported_under_those_settings_by_the_servers_and_run() -> None:
    """The settings reach gRPC only if a command's modules import it inside them: one imported
    later (in its handler) would run with gRPC's defaults."""
    for command in ("coordinator", "agent", "run"):
        code = ("import sys; from holdfast.cli import main\n"
                f"with main.grpc_settings(): main.build_parser({command!r})\n"
                "sys.exit('grpc' not in sys.modules)")
        assert subprocess.run([sys.executable, "-c", code]).returncode == 0, command


def test_up_and_exec_help_name_the_state_directory_they_use() -> None:
    """`up --help` said the default was ./state; it is $XDG_STATE_HOME/holdfast."""
    env = {k: v for k, v in os.environ.items() if k != "HOLDFAST_STATE_DIR"}
    for command in ("up", "exec"):
        shown = subprocess.run([sys.executable, "-m", "holdfast.cli", command, "--help"], capture_output=True,
                               text=True, check=True, env={**env, "XDG_STATE_HOME": "/nowhere/xdg",
                                                          "COLUMNS": "400"}).stdout
        assert "here /nowhere/xdg/holdfast" in shown and "./state" not in shown, shown


def listing(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    """What `--help` says of each top-level command."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action.help for action in sub._choices_actions}


def test_the_top_level_summaries_are_the_ones_the_modules_register() -> None:
    registered = listing(main.build_parser())
    assert {name: registered[name] for name in main.COMMANDS} == main.SUMMARIES
    assert listing(main.build_parser(light=True)) == registered


# What the top-level help and the version import: neither gRPC nor the protos (190 ms of a
# `holdfast --version` was importing them).
IMPORTED = """
import json, sys
from holdfast.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["version"], ["version", "--json"], [],
                                  ["nosuchcommand"]])
def test_version_and_help_import_neither_grpc_nor_the_protos(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", IMPORTED, json.dumps(argv)], capture_output=True, text=True,
                          timeout=60)
    loaded = json.loads(done.stderr.splitlines()[-1])
    assert "holdfast.cli.main" in loaded
    assert [m for m in loaded if m.startswith(("grpc", "holdfast.v1", "google.protobuf"))] == [], argv


# A Ctrl-C while `run`'s modules load (sent from inside the parser's build, as it would come then).
LOADING = """
import os, signal, sys
from holdfast.cli import main as cli
build = cli.build_parser

def interrupted_build(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return build(*args, **kwargs)

cli.build_parser = interrupted_build
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(cli.main(["run", "--session", "sess-held-0001", "--report", sys.argv[1], "--coordinator",
                   "127.0.0.1:1", "--", "true"]))
"""


def test_a_ctrl_c_while_loading_ends_the_command_interrupted_with_its_report(tmp_path: Path) -> None:
    """It raised KeyboardInterrupt from an import: no report. Held, the command ends as interrupted
    before it asks anything (127.0.0.1:1 answers nothing: asked, it would be 69)."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", LOADING, str(report)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 130 and done.stderr.startswith("holdfast: INTERRUPTED: "), done.stderr
    assert done.stderr.count("\n") == 1
    said = json.loads(report.read_text())
    assert (said["ran"], said["exit_code"], said["reason"]) == (False, 130, "INTERRUPTED")


def test_the_collector_is_paused_while_modules_load_and_left_as_found() -> None:
    """Its passes over every object the imports made were ~5 ms of every `run`'s start; what the
    imports made is frozen, so the first pass after it resumes does not walk it all at once."""
    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with main.collector_paused():
            assert not gc.isenabled()
            made = [[] for _ in range(100)]
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
        gc.disable()  # a caller's own pause stays
        with main.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_command_loads_with_the_collector_paused() -> None:
    program = ("import gc, sys; from holdfast.cli import main; "
               "main.build_parser = lambda *a, **k: sys.exit(int(gc.isenabled())); main.main(['version'])")
    assert subprocess.run([sys.executable, "-c", program]).returncode == 0
