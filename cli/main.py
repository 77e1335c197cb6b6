"""The `holdfast` command line: one parser, each command group contributed by the module that owns it.

Exit codes (docs/design.md §6): CMD's status for `run`; 75 held or unknown (EX_TEMPFAIL); 69 coordinator
unreachable; 77 authentication failure; 2 usage errors; 78 (EX_CONFIG) a command whose extra this
install lacks (the message names it); 130 (128 + SIGINT) interrupted by Ctrl-C; 141
(128 + SIGPIPE, as a shell reports a command ended by a closed pipe) when the reader of stdout went
away, e.g. `holdfast status | head -1`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import signal
import sys
from collections.abc import Iterator

from holdfast.common.version import JSON_SCHEMA, VERSION, install_hint

# The module that contributes each top-level command. Parsing a known command imports only its own
# module: `run` starts every session, and importing every part (the agent, the coordinator's etcd
# client, certificate making, the local stack) cost more than the interpreter and grpc together
# (docs/benchmarks.md, *`run` on a free session*); a module with `register_<command>` (run_commands'
# `register_run`) builds that command's parser alone. tests/unit/test_cli_commands.py keeps this map
# equal to what each module registers.
COMMANDS = {
    "agent": "holdfast.cli.agent_commands",
    "certs": "holdfast.common.certs",
    "coordinator": "holdfast.cli.serve_commands",
    **dict.fromkeys(["run", "put", "handle", "get", "status", "show", "probe", "recover", "hosts"],
                    "holdfast.cli.run_commands"),
    **dict.fromkeys(["drain", "admin"], "holdfast.cli.lifecycle_commands"),
    **dict.fromkeys(["up", "exec"], "holdfast.localstack.up"),
    **dict.fromkeys(["codex", "claude"], "holdfast.cli.provider_commands"),
}

# Each command's line in `holdfast --help`, here so that the top-level help, `--version` and
# `version` import no command module: each imports gRPC and the protos (`holdfast --version` took
# ~190 ms). tests/unit/test_cli_commands.py keeps each equal to the help its module registers.
SUMMARIES = {
    "agent": "the per-host agent",
    "certs": "make a local CA and a certificate per role",
    "coordinator": "the etcd-backed lease service",
    "run": "run CMD as the session's single writer",
    "put": "fenced write from inside `holdfast run`",
    "handle": "record the provider's handle (e.g. a thread id) from inside `holdfast run`",
    "get": "read a session's fenced data",
    "status": "hosts (draining ones marked) and sessions",
    "show": "one session's record and history",
    "probe": "ask the owner's host whether it lives",
    "recover": "operator: invalidate a fence you know is dead (the only way out of unknown)",
    "hosts": "registered hosts, which are draining, and lost hosts' fencing",
    "drain": "hand off every session on HOST and refuse new grants there",
    "admin": "operator procedures",
    "up": "etcd, a coordinator and agents on this machine",
    "exec": "run CMD on a simulated host of `holdfast up --hosts N`",
    "codex": "a `codex` turn as the session's single writer, resumed on any host",
    "claude": "a `claude` turn as the session's single writer, resumed on any host",
}

# The base install is the client (pyproject.toml): a server command, or a client feature that needs
# x509, imports what only an extra installs. The command's own extra, else the one with that module,
# is named instead of a traceback.
COMMAND_EXTRAS = {"agent": "agent", "coordinator": "coordinator", "up": "server", "exec": "server"}
MODULE_EXTRAS = {"cryptography": "certs", "aetcd": "coordinator", "kubernetes": "coordinator",
                 "prometheus_client": "server", "grpc_health": "server", "grpc_reflection": "server"}

EX_USAGE = 2
EX_CONFIG = 78
EX_PIPE = 128 + 13  # SIGPIPE
EX_INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it


def python_version() -> str:
    return ".".join(str(part) for part in sys.version_info[:3])  # `platform` costs every command 1.3 ms


def grpcio_version() -> str:
    # From the installed distribution's metadata: importing grpc for its __version__ made
    # `holdfast --version` take ~190 ms.
    from importlib.metadata import version

    return version("grpcio")


def version_text() -> str:
    return f"holdfast {VERSION} (Python {python_version()}, grpcio {grpcio_version()})"


def _version(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"schema": JSON_SCHEMA, "version": VERSION, "python": python_version(),
                          "grpcio": grpcio_version()}))
    else:
        print(version_text())
    return 0


class _VersionFlag(argparse.Action):
    """`--version`: the text is made only when asked for (argparse's own takes it at build time)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print this holdfast's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(version_text())
        parser.exit()


# What gRPC's C core is told when a command imports it, each unless the user set it:
# - GRPC_VERBOSITY=NONE: it logs to stderr by itself (`I1204 … ssl_transport_security.cc … Handshake
#   failed` before the CLI's one line, and non-JSON lines in a server's JSON log);
# - its EventEngine client and listener off: gRPC 1.85's iomgr path costs the coordinator ~0.3 ms
#   less CPU per `run` cycle of nine calls (docs/benchmarks.md, alternated runs), and a release
#   that no longer knows the names is quiet about them (the verbosity above).
GRPC_IMPORT_ENV = {"GRPC_VERBOSITY": "NONE",
                   "GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener"}


@contextlib.contextmanager
def grpc_settings() -> Iterator[None]:
    """GRPC_IMPORT_ENV while the command's modules are imported: gRPC reads it once, then. Only
    then, so CMD and every child inherit the environment as it was."""
    added = {name: value for name, value in GRPC_IMPORT_ENV.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def build_parser(only: str | None = None, *, light: bool = False) -> argparse.ArgumentParser:
    """The whole parser; with `only` (a key of COMMANDS) just `version` and that command's module
    (that command alone when the module has `register_<only>`);
    `light`: every command named with its summary, no command module imported (the top-level
    help, `--version`, `version`, a mistyped command)."""
    parser = argparse.ArgumentParser(prog="holdfast", description="At most one live writer per session.")
    parser.add_argument("--version", action=_VersionFlag)
    sub = parser.add_subparsers(dest="command", required=True)
    version = sub.add_parser("version", help="this holdfast's version (the agent reports the same in "
                             "`holdfast hosts`)")
    version.add_argument("--json", action="store_true", help="print one JSON document")
    version.set_defaults(handler=_version)
    modules = [] if light else [COMMANDS[only]] if only else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        try:
            loaded = importlib.import_module(module)
            alone = getattr(loaded, f"register_{only}", None) if only else None
            (alone or loaded.register)(sub)
        except ModuleNotFoundError as err:
            # The completion script of a client-only install completes the commands it can run.
            if only or missing_extra("", err) is None:
                raise
    if light:
        for name in COMMANDS:
            sub.add_parser(name, help=SUMMARIES.get(name), add_help=False)
    if not only:
        from holdfast.cli import completion  # not for a known command's own parser, e.g. `run`'s

        completion.register(sub, parser)  # last: it completes every command registered above
    return parser


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while the command's modules load, and what they made
    then set aside from its passes (`gc.freeze`: module-level objects live as long as the process).
    Loading grpc, protobuf and holdfast's modules made it run ~45 times, each pass walking every
    object made so far: ~5 ms of every `run`'s start before CMD. A collector the caller paused
    stays paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # else the first allocation after enable() walks every object the imports made
        gc.enable()


@contextlib.contextmanager
def held_interrupt() -> Iterator[list[int]]:
    """A Ctrl-C while the command's modules load is held, and noted in the list yielded: the command
    then ends as interrupted before it asks anything (`run --report` written, saying so). Raised as
    it came, it left no report. A SIGINT this process ignores stays ignored."""
    noted: list[int] = []
    holding = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if holding:
        signal.signal(signal.SIGINT, lambda *_: noted.append(1))
    try:
        yield noted
    finally:
        if holding:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def missing_extra(command: str, err: ModuleNotFoundError) -> str | None:
    """The extra that installs the module `command` missed; None when no extra has it (a bug)."""
    module = (err.name or "").split(".")[0]
    if module not in MODULE_EXTRAS:
        return None
    return COMMAND_EXTRAS.get(command, MODULE_EXTRAS[module])


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        return _main(words)
    except ModuleNotFoundError as err:
        command = words[0] if words else ""
        extra = missing_extra(command, err)
        if extra is None:
            raise
        print(f"holdfast: `holdfast {command}` needs {err.name}, which this install lacks: "
              f"{install_hint(extra)}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling (e.g. while importing)
        print("holdfast: interrupted (Ctrl-C)", file=sys.stderr)
        return EX_INTERRUPTED


def _main(words: list[str]) -> int:
    first = words[0] if words else ""
    with grpc_settings(), held_interrupt() as interrupted, collector_paused():
        # A completion script completes every command: it alone needs them all (its --ids, at
        # every press of Tab, none).
        parser = build_parser(first if first in COMMANDS else None,
                              light=first not in COMMANDS and (first != "completion" or "--ids" in words))
        args = parser.parse_args(words)
    args.interrupted = bool(interrupted)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
    except SystemExit as exit_:
        # A server refusing to start after it set up its log (its address taken): said in that log.
        if not isinstance(exit_.code, str):
            raise
        from holdfast.common import logs

        logs.fatal(exit_.code)
        return 1
    except BrokenPipeError:
        # The reader is gone (`| head -1`): nothing more to say to it, and no traceback. Point
        # stdout at /dev/null so the interpreter's own flush at exit cannot fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EX_PIPE
    return code
