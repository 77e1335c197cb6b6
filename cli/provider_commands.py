"""`holdfast codex` and `holdfast claude`: an agent CLI's non-interactive turn (`codex exec`,
`claude -p`) as the session's single writer, on any host — `holdfast run` with the provider's
recipe built in (docs/recipes.md).

Guarantee: each takes every option of `run` and runs through it; on a first run it starts the CLI's
thread and records its handle as soon as it exists, later it resumes the recorded one; it carries
only what the CLI needs to resume (Codex `sessions/`, Claude Code `projects/<this directory's
key>/`). Before anything is asked of the session: a CLI not on PATH exits 127, and a Claude Code
session recorded for another working directory is refused (2), naming that directory. Before
anything is made or written: `run`'s options that do not go together are refused (2); so is a state
directory another user could change, or one reached through their directory or link — with root's
HOME another user's (sudo without -H), their link would take root's restore anywhere. The state
directory is made only once the session is granted: a refused run (HELD) leaves none behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys

from holdfast.cli import run_commands
from holdfast.cli.options import failed
from holdfast.client import provider_rules as rules
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.common.reasons import Reason


def _run_parser() -> argparse.ArgumentParser:
    """`holdfast run`'s own parser: a provider command takes every one of its options, and its
    handler does the rest."""
    scratch = argparse.ArgumentParser().add_subparsers()
    run_commands.register(scratch)
    return scratch.choices["run"]


async def _check_cwd(args: argparse.Namespace) -> None:
    async with Client(args.coordinator, args.host_id, args.tls_dir) as client:
        found = await client.fenced_get(args.session, rules.CLAUDE_CWD_KEY)
    try:
        rules.check_cwd(found.value.decode() if found.found else "", os.getcwd())
    except rules.ProviderRefused as refused:
        raise ClientError(Reason.INVALID_ARGUMENT, str(refused), args.session) from None


def _check(args: argparse.Namespace, provider: rules.Provider) -> str:
    """The CLI's path, once nothing stands in the way; else the refusal, before anything is asked
    of the session."""
    cli = shutil.which(provider.command)
    if not cli:
        raise ClientError(Reason.CMD_NOT_FOUND, f"{provider.command}: command not found on PATH; nothing was "
                          f"asked of session {args.session}. Next: install it (tests/clis/package.json pins "
                          "the tested version) or put it on PATH", args.session)
    if provider.name == rules.CLAUDE:
        asyncio.run(_check_cwd(args))
    return cli


def _carried(args: argparse.Namespace, provider: rules.Provider) -> str:
    """What is carried; its directory is made by `run` once granted if missing (RunSpec.made_at_grant)
    — where a first run's CLI makes it: `run --carry` needs the directory of a path that does not
    exist yet, and uploads the path if the CLI made it. That directory must be this user's alone,
    and neither it nor any directory above it, nor one a link on the way is read from, another
    user's or one they may change (files.open_private_path, as `up`'s state directory): checked
    now without making anything (files.open_existing_private_path), else ClientError."""
    state = rules.state_dir(provider, os.environ)
    carried = rules.carried_path(provider, state, os.getcwd())
    try:
        fd = files.open_existing_private_path(os.path.dirname(carried))
    except OSError as exc:
        raise ClientError(
            Reason.INVALID_ARGUMENT,
            f"{exc.filename or os.path.dirname(carried)}: {exc.strerror}: {provider.command}'s state "
            f"directory {state} must be uid {os.geteuid()}'s alone, in directories no other user may change "
            f"(with sudo, pass -H, or set {provider.state_env}); nothing was made, nor a grant asked for",
            args.session) from None
    if fd is not None:
        os.close(fd)
    return carried


def _provider_handler(args: argparse.Namespace) -> int:
    provider = rules.PROVIDERS[args.command]
    run_commands.check_options(args, carries=True)  # a refusal below writes the --report
    try:
        cli = _check(args, provider)
        carried = _carried(args, provider)
    except ClientError as err:
        code = failed(args, err)
        if args.report:  # as `run` writes it for a refusal: CMD never ran
            run_commands.write_report(args.report, run_commands.run_report(args.session, code, None, 0, err))
        return code
    words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    args.cmd = [sys.executable, "-m", "holdfast.client.provider", args.command, cli, *words]
    args.carry = [*args.carry, carried]
    args.made_at_grant = [os.path.dirname(carried)]
    args.provider = args.provider or provider.name
    return int(args.run_handler(args))


EXAMPLES = {
    "codex": """examples:
  holdfast codex --session fix-login -- "find why login fails"   start a thread
  holdfast codex --session fix-login -- "now write the test"     resume it, here or on another host
  holdfast codex --session fix-login --takeover -- "go on"       take it over from the host running it

runs `codex exec --json --skip-git-repo-check [resume THREAD] ARGS` with stdin closed (it prints
codex's JSON events); carries $CODEX_HOME/sessions (default ~/.codex/sessions). Exit status as
`holdfast run`'s.""",
    "claude": """examples:
  holdfast claude --session fix-login -- "find why login fails"  start a conversation
  holdfast claude --session fix-login -- "now write the test"    resume it, here or on another host
  holdfast claude --session fix-login --takeover -- "go on"      take it over from the host running it

runs `claude -p --session-id ID ARGS` (the id recorded first), later `claude -p --resume ID ARGS`;
carries $CLAUDE_CONFIG_DIR/projects/<this directory's key> (default ~/.claude/projects/...): run it
from the same directory path on every host. Exit status as `holdfast run`'s.""",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    run = _run_parser()
    for name, provider in rules.PROVIDERS.items():
        p = subparsers.add_parser(
            name, parents=[run], add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
            usage=f"holdfast {name} --session ID [run options] [--] [{provider.command} ARGS...]",
            help=f"a `{provider.command}` turn as the session's single writer, resumed on any host",
            description=f"`holdfast run` with the {provider.command} recipe built in: the session's "
            f"{provider.command} thread is started or resumed, its handle recorded, its state carried.",
            epilog=EXAMPLES[name])
        p.set_defaults(handler=_provider_handler, run_handler=run.get_default("handler"), parser=p)
