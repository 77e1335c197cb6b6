"""One turn of an agent CLI as a session's writer: the CMD that `holdfast codex` and `holdfast claude`
give `holdfast run` (`python -m holdfast.client.provider codex|claude CLI [ARGS...]`). It starts the
CLI's thread, or resumes `$HOLDFAST_PROVIDER_HANDLE`, and records the thread's handle under the grant
(`$HOLDFAST_GRANT_FILE`) as soon as it exists.

Guarantee: Claude Code's id is chosen and recorded, with the working directory its transcript is
keyed by, before Claude Code starts; Codex's thread id is recorded when its `thread.started` event is
read, before any later line is passed on. When a record is refused (this writer was superseded), the
CLI is not started, or is ended, and the turn exits 75. Codex reads no standard input (it would wait
for an EOF a supervisor's open pipe never sends).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

from holdfast.client import provider_rules as rules
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common import env, reasons


async def _record(grant: Grant, handle: str, cwd: str = "") -> None:
    async with Client() as client:
        if cwd:
            await client.fenced_put(grant, rules.CLAUDE_CWD_KEY, cwd.encode())
        await client.record_provider_handle(grant, handle)


async def _recorded_cwd(session: str) -> str:
    async with Client() as client:
        found = await client.fenced_get(session, rules.CLAUDE_CWD_KEY)
    return found.value.decode() if found.found else ""


def _claude(grant: Grant, cli: str, handle: str, args: list[str]) -> int:
    cwd = os.getcwd()
    new_id = ""
    if handle:
        # Read again under the grant: a first run elsewhere may have recorded it since the check
        # `holdfast claude` made before asking for the session.
        rules.check_cwd(asyncio.run(_recorded_cwd(grant.session_id)), cwd)
    else:
        new_id = str(uuid.uuid4())
        asyncio.run(_record(grant, new_id, cwd))
    argv = rules.claude_argv(cli, handle, new_id, args)
    os.execv(cli, argv)
    return 0  # not reached


def _codex(grant: Grant, cli: str, handle: str, args: list[str]) -> int:
    argv = rules.codex_argv(cli, handle, args)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = sys.stdout.buffer
    try:
        for line in proc.stdout:
            thread = "" if handle else rules.thread_started(line)
            if thread:
                asyncio.run(_record(grant, thread))
                handle = thread
            out.write(line)
            out.flush()
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    code = proc.wait()
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    name, cli, *args = argv
    provider = rules.PROVIDERS[name]
    handle = os.environ.get(env.PROVIDER_HANDLE, "")
    try:
        grant = Grant.from_file(os.environ[env.GRANT_FILE])
    except (OSError, ValueError) as exc:
        print(f"holdfast {name}: cannot read the grant file: {exc}", file=sys.stderr)
        return reasons.EX_USAGE
    try:
        turn = _codex if provider.name == rules.CODEX else _claude
        return turn(grant, cli, handle, args)
    except rules.ProviderRefused as refused:
        print(f"holdfast {name}: {refused}", file=sys.stderr)
        return reasons.EX_USAGE
    except ClientError as err:
        print(f"holdfast {name}: the thread's handle was not recorded: {err}", file=sys.stderr)
        return reasons.EX_TEMPFAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
