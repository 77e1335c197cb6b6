"""The rules of running an agent CLI as a session's writer (`holdfast codex`, `holdfast claude`):
how each CLI is started or resumed non-interactively, where its handle appears, which of its files
resume needs, and Claude Code's key for a working directory. Pure: no I/O.

Guarantee: every rule here was read off the real CLIs (npm `@openai/codex` 0.171.0,
`@anthropic-ai/claude-code` 2.1.332) and is tested against their recorded output
(tests/unit/samples/). A handle is taken only from a whole `thread.started` event, never from text
a model wrote; a handle not in the form the CLI gives is refused before any CLI is asked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

CODEX, CLAUDE = "codex", "claude-code"
# A Codex thread id and a Claude Code session id are both UUIDs (Codex's are v7).
HANDLE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Claude Code names a project directory by its path with every UTF-16 code unit that is not an ASCII
# letter or digit made `-`; a key longer than this is cut there and a hash of the path appended.
CLAUDE_KEY_MAX = 200
CLAUDE_CWD_KEY = "claude-code/cwd"  # the session's fenced data: the directory its transcript is keyed by


class ProviderRefused(Exception):
    """Why a provider command cannot run as asked; said before anything is asked of the session."""


@dataclass(frozen=True)
class Provider:
    name: str         # recorded with the session (`--provider`)
    command: str      # the CLI's executable, found on PATH
    state_env: str    # the variable naming the CLI's state directory
    state_default: str  # its default, below $HOME


PROVIDERS = {
    "codex": Provider(CODEX, "codex", "CODEX_HOME", ".codex"),
    "claude": Provider(CLAUDE, "claude", "CLAUDE_CONFIG_DIR", ".claude"),
}


def state_dir(provider: Provider, env: Mapping[str, str]) -> str:
    """The CLI's state directory as the CLI itself finds it."""
    return env.get(provider.state_env) or os.path.join(env.get("HOME") or "/", provider.state_default)


def _utf16_units(text: str) -> list[int]:
    data = text.encode("utf-16-le", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "little") for i in range(0, len(data), 2)]


def _djb2(units: list[int]) -> int:
    """JavaScript's `hash = (hash << 5) - hash + code | 0` over the code units: a signed 32-bit int."""
    value = 0
    for unit in units:
        value = (value * 31 + unit) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, rest = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
        if not number:
            return digits


def claude_cwd_key(cwd: str) -> str:
    """The name of the directory under `projects/` where Claude Code keeps this directory's
    transcripts: `/work/my app` is `-work-my-app`; an emoji (two UTF-16 units) is `--`; past 200
    characters the key is cut and `-<base36 of |djb2(path)|>` appended."""
    units = _utf16_units(cwd)
    key = "".join(chr(u) if u < 128 and chr(u).isalnum() else "-" for u in units)
    if len(key) <= CLAUDE_KEY_MAX:
        return key
    return f"{key[:CLAUDE_KEY_MAX]}-{_base36(abs(_djb2(units)))}"


def carried_path(provider: Provider, state: str, cwd: str) -> str:
    """What resume needs, and all that is carried: Codex's rollouts (`sessions/`: Codex rebuilds its
    index from them; the rest of CODEX_HOME is megabytes of skills and SQLite files), Claude Code's
    transcripts of this working directory (`projects/<cwd key>/`)."""
    if provider.name == CODEX:
        return os.path.join(state, "sessions")
    return os.path.join(state, "projects", claude_cwd_key(cwd))


def check_handle(handle: str) -> str:
    if not HANDLE.fullmatch(handle):
        raise ProviderRefused(f"the session's provider handle {handle!r} is not a thread id this CLI gives "
                              "(a UUID): it was recorded by something else")
    return handle


def check_cwd(recorded: str, cwd: str) -> None:
    """A session's transcript is carried under the key of the directory it started in: from another
    directory it would be neither restored nor found (`--resume` answers "No conversation found")."""
    if recorded and recorded != cwd:
        raise ProviderRefused(f"this session's Claude Code transcript is kept for the working directory "
                              f"{recorded}, and this is {cwd}: it is carried and found only from there. "
                              f"Next: cd {recorded} (the same path on this host) and run it again")


def codex_argv(cli: str, handle: str, args: list[str]) -> list[str]:
    """`codex exec` as a session's writer: JSON events (the handle is in the first), no git-repository
    check (Codex refuses to run outside one otherwise), a resume when the session has a handle."""
    head = [cli, "exec", "--json", "--skip-git-repo-check"]
    return [*head, "resume", check_handle(handle), *args] if handle else [*head, *args]


def claude_argv(cli: str, handle: str, new_id: str, args: list[str]) -> list[str]:
    """`claude -p`: a new conversation under the id chosen (and recorded) before it starts, or the
    recorded one resumed."""
    if handle:
        return [cli, "-p", "--resume", check_handle(handle), *args]
    return [cli, "-p", "--session-id", check_handle(new_id), *args]


def thread_started(line: str | bytes) -> str:
    """The thread id of a `codex exec --json` line that is the `thread.started` event, else ''."""
    try:
        event = json.loads(line)
    except ValueError:
        return ""
    if not isinstance(event, dict) or event.get("type") != "thread.started":
        return ""
    thread = event.get("thread_id")
    return thread if isinstance(thread, str) and HANDLE.fullmatch(thread) else ""
