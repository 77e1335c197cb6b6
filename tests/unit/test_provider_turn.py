"""One turn of a CLI under `holdfast codex` (client/provider.py), with a fake `codex` and the record
taken in place of the coordinator's: the handle is recorded before any later line is passed on,
Codex reads no standard input, and a refused record ends the CLI and the turn with 75."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from holdfast.client import provider
from holdfast.client.errors import ClientError
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.common import env
from holdfast.common.reasons import Reason

THREAD = "01a24394-af02-7c81-b8aa-7915554f6c50"
STARTED = f'{{"type":"thread.started","thread_id":"{THREAD}"}}'


class Stdout:
    def __init__(self) -> None:
        self.buffer = io.BytesIO()


@pytest.fixture
def turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stdout:
    grant = Grant("sess-unit-turn", 1, "secret", "token", "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:1")
    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    grant.write(held)
    os.close(held)
    monkeypatch.setenv(env.GRANT_FILE, str(tmp_path / GRANT_FILE))
    monkeypatch.setenv(env.PROVIDER_HANDLE, "")
    return Stdout()  # sys.stdout is replaced by it in the test itself: pytest's capture resets it


def fake_codex(tmp_path: Path, body: str) -> str:
    path = tmp_path / "codex"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_the_handle_is_recorded_before_the_next_line_and_stdin_is_closed(
        tmp_path: Path, turn: Stdout, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[str, bytes]] = []

    async def record(grant: Grant, handle: str, cwd: str = "") -> None:
        recorded.append((handle, turn.buffer.getvalue()))

    monkeypatch.setattr(provider, "_record", record)
    # A supervisor's stdin that never ends, as this process's fd 0: Codex must not wait on it.
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)
    waits = "timeout 5 cat >/dev/null || echo '{\"stdin\":\"open\"}'"
    cli = fake_codex(tmp_path, f"echo '{STARTED}'; {waits}; echo '{{\"type\":\"turn.started\"}}'")
    monkeypatch.setattr(provider.sys, "stdout", turn)
    try:
        assert provider.main(["codex", cli, "hi"]) == 0
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    assert recorded == [(THREAD, b"")], "recorded before its own line, let alone a later one, was passed on"
    assert turn.buffer.getvalue().decode().splitlines() == [STARTED, '{"type":"turn.started"}']


def test_a_refused_record_ends_the_cli_and_the_turn_is_75(tmp_path: Path, turn: Stdout,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused(grant: Grant, handle: str, cwd: str = "") -> None:
        raise ClientError(Reason.STALE_FENCE, "superseded")

    monkeypatch.setattr(provider, "_record", refused)
    cli = fake_codex(tmp_path, f"echo '{STARTED}'; exec sleep 60")
    started = time.monotonic()
    monkeypatch.setattr(provider.sys, "stdout", turn)
    assert provider.main(["codex", cli, "hi"]) == 75
    assert time.monotonic() - started < 30, "the CLI was ended, not waited for"
    assert turn.buffer.getvalue() == b"", "nothing after a refused record is passed on"


def test_a_handle_the_cli_does_not_give_is_refused_before_it_runs(tmp_path: Path, turn: Stdout,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.PROVIDER_HANDLE, "--last")
    ran = tmp_path / "ran"
    assert provider.main(["codex", fake_codex(tmp_path, f"touch {ran}"), "hi"]) == 2
    assert not ran.exists()
