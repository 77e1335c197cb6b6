"""`holdfast up --tls`: the whole local stack on mTLS (etcd on its own CA, coordinator, a simulated
host's agent registering with its own certificate), found by the CLI through the state dir; a
`run` there commits through the agent over mTLS and its child's fenced `put` lands; plaintext to
the same coordinator gets no answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.common import upstate

pytestmark = [pytest.mark.timeout(180), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]
CLI = [sys.executable, "-m", "holdfast.cli"]
IP_BASE = 160  # host 1 on 127.0.0.161, clear of the other fixtures' addresses


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
    return {**env, **extra}


@pytest.fixture
def up_tls(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict]]:  # type: ignore[type-arg]
    hosts = str(getattr(request, "param", 1))
    state = tmp_path / "state"
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        # Its own default state directory (XDG_STATE_HOME), where it says which state directory
        # serves its address; a CLI under another one has no such word.
        proc = subprocess.Popen([*CLI, "up", "--tls", "--hosts", hosts, "--listen", "127.0.0.1:0",
                                 "--ip-base", str(IP_BASE), "--state-dir", str(state)],
                                stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env=clean_env(XDG_STATE_HOME=str(tmp_path / "xdg")))
    try:
        deadline = time.monotonic() + 90
        while b"ready;" not in out.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        yield state, json.loads((state / "up.json").read_text())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, out.read_text()


def holdfast(*argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=clean_env(**env))


def test_up_tls_status_run_and_plaintext_refused(up_tls, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state, recorded = up_tls
    assert recorded["tls_dir"] and recorded["etcd"].startswith("https://")
    status = holdfast("status", "--json", "--coordinator", recorded["coordinator"], cwd=tmp_path,
                      HOLDFAST_STATE_DIR=str(state))
    assert status.returncode == 0, status.stderr
    assert [h["host_id"] for h in json.loads(status.stdout)["hosts"]] == ["host-1"]

    # The same coordinator without certificates (nothing says where they are): it speaks TLS.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plain = holdfast("status", "--json", "--coordinator", recorded["coordinator"], cwd=elsewhere,
                     XDG_STATE_HOME=str(elsewhere))
    assert plain.returncode == 77 and json.loads(plain.stdout)["error"]["reason"] == "TLS_REQUIRED"

    sid = "session-up-tls-1"
    ran = holdfast("exec", "--host", "1", "--state-dir", str(state), "--", *CLI, "run", "--session", sid,
                   "--", *CLI, "put", "greeting", "over-mtls", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    got = holdfast("get", "greeting", "--session", sid, "--coordinator", recorded["coordinator"],
                   cwd=tmp_path, HOLDFAST_TLS_DIR=recorded["tls_dir"])
    assert got.returncode == 0 and got.stdout == "over-mtls\n", got.stderr  # a line, as etcdctl prints
    raw = holdfast("get", "greeting", "--raw", "--session", sid, "--coordinator", recorded["coordinator"],
                   cwd=tmp_path, HOLDFAST_TLS_DIR=recorded["tls_dir"])
    assert raw.returncode == 0 and raw.stdout == "over-mtls", raw.stderr  # the bytes alone
    # The operator commands present up's operator certificate (issued beside client.pem).
    assert (Path(recorded["tls_dir"]) / "operator.pem").exists()
    drained = holdfast("drain", "host-1", "--coordinator", recorded["coordinator"], cwd=tmp_path,
                       HOLDFAST_TLS_DIR=recorded["tls_dir"])
    assert drained.returncode == 0, drained.stderr
    undone = holdfast("drain", "host-1", "--undo", "--coordinator", recorded["coordinator"], cwd=tmp_path,
                      HOLDFAST_TLS_DIR=recorded["tls_dir"])
    assert undone.returncode == 0, undone.stderr


def test_exec_keeps_the_callers_directory_and_run_puts_the_cli_on_path(  # type: ignore[no-untyped-def]
        up_tls, tmp_path: Path) -> None:
    """Issue 17: `exec --host` ran CMD in `/` (relative paths failed), and inside `run` a bare
    `holdfast` was not on PATH unless the venv was activated."""
    state, recorded = up_tls
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("here\n")
    shown = holdfast("exec", "--host", "1", "--state-dir", str(state), "--", "cat", "note.txt", cwd=work)
    assert shown.returncode == 0 and shown.stdout == "here\n", shown.stderr
    bare_path = "/usr/sbin:/usr/bin:/sbin:/bin"  # no venv: `holdfast` itself is not on it
    sid = "session-up-tls-path"
    ran = holdfast("exec", "--host", "1", "--state-dir", str(state), "--", *CLI, "run", "--session", sid,
                   "--", "sh", "-c", "holdfast put where \"$PWD\"", cwd=work, PATH=bare_path)
    assert ran.returncode == 0, ran.stderr
    got = holdfast("get", "where", "--session", sid, "--coordinator", recorded["coordinator"],
                   cwd=tmp_path, HOLDFAST_TLS_DIR=recorded["tls_dir"])
    assert got.returncode == 0 and got.stdout == f"{work}\n", got.stderr


def test_plaintext_to_up_tls_is_told_at_once_and_the_cli_finds_its_certificates(  # type: ignore[no-untyped-def]
        up_tls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plaintext call to `up --tls`: one try, then TLS_REQUIRED naming --tls-dir (it retried for
    5.7 s and advised starting a coordinator). An `up --state-dir X` is found for its address from
    any directory, through the word it left in the default state directory."""
    state, recorded = up_tls
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("HOLDFAST_STATE_DIR", "HOLDFAST_TLS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(elsewhere))

    async def plaintext() -> ClientError:
        async with Client(recorded["coordinator"], "host-x") as client:
            assert client.tls_dir is None
            with pytest.raises(ClientError) as refused:
                await client.list_hosts()
            return refused.value

    error = asyncio.run(plaintext())
    assert (error.reason, error.exit_code, error.retried) == ("TLS_REQUIRED", 77, False)
    assert "--tls-dir" in error.next_step and "holdfast up`" not in error.next_step

    found = holdfast("status", "--json", "--coordinator", recorded["coordinator"], cwd=elsewhere,
                     XDG_STATE_HOME=str(tmp_path / "xdg"))
    assert found.returncode == 0, found.stderr
    assert upstate.pointed(recorded["coordinator"]) is None  # under `elsewhere`: no word there
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert upstate.pointed(recorded["coordinator"]) == state.resolve()


@pytest.mark.parametrize("up_tls", [2], indirect=True)
def test_two_tenants_on_up_tls(up_tls, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Tenant b's forced takeover of tenant a's live session is refused (77) and a's CMD runs on;
    b's status never shows a's session, nor does the default tenant's (up's client.pem)."""
    state, recorded = up_tls
    ca, address = recorded["tls_dir"], recorded["coordinator"]
    for team in ("team-a", "team-b"):
        issued = holdfast("certs", "issue", ca, "--role", "client", "--tenant", team, "--out",
                          str(tmp_path / team), cwd=tmp_path)
        assert issued.returncode == 0, issued.stderr
    sid = "session-of-team-a"
    owner = subprocess.Popen([*CLI, "exec", "--host", "1", "--state-dir", str(state), "--", *CLI, "run",
                              "--tls-dir", str(tmp_path / "team-a"), "--session", sid, "--", "sh", "-c",
                              "echo $$ > owner.tmp && mv owner.tmp owner.pid; exec sleep 300"],
                             cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "owner.pid").exists():
            assert owner.poll() is None and time.monotonic() < deadline, owner.stderr.read()  # type: ignore[union-attr]
            time.sleep(0.05)
        taken = holdfast("exec", "--host", "2", "--state-dir", str(state), "--", *CLI, "run", "--tls-dir",
                         str(tmp_path / "team-b"), "--session", sid, "--takeover", "--force", "--", "true",
                         cwd=tmp_path)
        assert taken.returncode == 77 and "WRONG_TENANT" in taken.stderr, taken.stderr
        assert owner.poll() is None
        os.kill(int((tmp_path / "owner.pid").read_text()), 0)  # a's CMD (in host 1's namespace) runs on

        def sessions(tls_dir: str, role: str = "client") -> dict[str, str]:
            shown = holdfast("status", "--json", "--coordinator", address, "--tls-dir", tls_dir,
                             "--role", role, cwd=tmp_path)
            assert shown.returncode == 0, shown.stderr
            return {s["session_id"]: s.get("tenant", "") for s in json.loads(shown.stdout)["sessions"]}

        assert sid not in sessions(str(tmp_path / "team-b"))
        assert sessions(str(tmp_path / "team-a"))[sid] == "team-a"
        assert sid not in sessions(ca), "up's client.pem names no tenant: the default tenant's view"
        assert sid in sessions(ca, "operator"), "up's own operator.pem is every tenant's"
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(30)
