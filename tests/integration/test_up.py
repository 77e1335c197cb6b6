"""`holdfast up` twice in a row on one state directory: each start becomes ready, each Ctrl-C
stops every process it started (etcd, coordinator, agent) and exits 0, and the second start finds
the first one's record again — a new run of the same session is granted at the next fence.
Two at once (issue 17): a second `up` on the same state directory refuses at once and leaves the
first's up.json; a second `up` on the same address cannot serve beside the first."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import unprivileged
from tests.integration.conftest import descendants
from tests.integration.run_fixtures import until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent reads other processes' environ as root")

CLI = [sys.executable, "-m", "holdfast.cli"]
SYS_TGKILL = 234  # x86-64


@pytest.fixture(autouse=True)
def own_default_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `up` here keeps its default state directory (XDG_STATE_HOME) in the test's tmp: an `up`
    with --state-dir points to it from the default one's addresses/, and one a test crashes left
    that pointer in the real home of the user running the suite."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def ups() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:  # a failed test must not leave a stack behind
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(10)


def start_up(state: Path, ups: list[subprocess.Popen[bytes]],
             listen: str = "127.0.0.1:0", *more: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([*CLI, "up", "--state-dir", str(state), "--listen", listen, *more],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ups.append(proc)
    def ours() -> bool:  # an up.json a crashed `up` left names another pid
        with contextlib.suppress(OSError, ValueError):
            return bool(json.loads((state / "up.json").read_text())["pid"] == proc.pid)
        return False

    until("up.json", lambda: ours() or proc.poll() is not None, timeout=60)
    assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
    return proc, json.loads((state / "up.json").read_text())["coordinator"]


def stop_up(proc: subprocess.Popen[bytes]) -> str:
    parts = descendants(proc.pid)
    assert len(parts) >= 3, "etcd, the coordinator and the agent run under up"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert [pid for pid in parts if Path(f"/proc/{pid}").exists()] == []
    return out.decode()


def cli(coordinator: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOLDFAST_COORDINATOR": coordinator, "HOLDFAST_HOST_ID": os.uname().nodename}
    return subprocess.run([*CLI, *argv], env=env, capture_output=True, text=True, timeout=60)


def lease(coordinator: str, session: str) -> dict[str, object]:
    shown = cli(coordinator, "show", session, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["record"]["lease"]  # type: ignore[no-any-return]


def test_up_twice_on_one_state_dir_keeps_records(tmp_path: Path, ups: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    proc, coordinator = start_up(state, ups)
    first = cli(coordinator, "run", "--session", "kept-session-01", "--", "true")
    assert first.returncode == 0, first.stderr
    assert lease(coordinator, "kept-session-01")["fence"] == 1
    out = stop_up(proc)
    assert "stopped" in out
    # Not the CLI's default address: up says how to point the CLI at it (issue 17).
    assert f"\nexport HOLDFAST_COORDINATOR={coordinator}\n" in out
    assert not (state / "up.json").exists(), "a stopped up leaves no state that exec would trust"

    proc, coordinator = start_up(state, ups)
    kept = lease(coordinator, "kept-session-01")
    assert kept["fence"] == 1 and kept["claim_status"] == "RELEASED"
    second = cli(coordinator, "run", "--session", "kept-session-01", "--", "true")
    assert second.returncode == 0, second.stderr
    assert lease(coordinator, "kept-session-01")["fence"] == 2
    stop_up(proc)


def test_second_up_on_a_running_state_dir_refuses_and_changes_nothing(
        tmp_path: Path, ups: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    proc, coordinator = start_up(state, ups)
    before = (state / "up.json").read_text()
    second = subprocess.run([*CLI, "up", "--state-dir", str(state), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 69, second.stderr
    assert f"another `holdfast up` (pid {proc.pid}) is running with state in {state}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert (state / "up.json").read_text() == before
    status = cli(coordinator, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["hosts"], status.stderr
    stop_up(proc)


def test_an_up_refused_before_it_starts_makes_locks_and_removes_nothing(tmp_path: Path) -> None:
    """`up --hosts N` as a user other than root, `up` where no etcd is found, `up --tls` listening on
    a name reserved to agents: each refused only after it had made the state directory, taken
    `up.lock`, and removed a dead `up`'s up.json (what the next `up` needs to release that one's
    leftover registrations). Refused first now (69)."""
    python, extra = unprivileged.interpreter()
    where = unprivileged.shared_dir("holdfast-refused-up-")
    where.chmod(0o1777)  # sticky, as /tmp: nobody's state directories in it are theirs alone
    try:
        host = {"host_id": "host-1", "lease_id": "7", "reaper_pid": 2 ** 22 + 2, "reaper_start_ticks": 1}
        left = json.dumps({"pid": 2 ** 22 + 1, "hosts": [host]})
        dead = where / "dead"
        subprocess.run([*unprivileged.DROP, "mkdir", "-m", "0755", str(dead)], check=True)
        subprocess.run([*unprivileged.DROP, "sh", "-c", f"cat > {dead}/up.json"], input=left.encode(),
                       check=True)
        env = {**os.environ, **extra}
        for state, argv, said in [
            (where / "a" / "state", [*unprivileged.DROP, python], "--hosts needs root"),
            (dead, [*unprivileged.DROP, python], "--hosts needs root"),
            (tmp_path / "b" / "state", [sys.executable], "no etcd binary found"),
        ]:
            refused = subprocess.run([*argv, "-m", "holdfast.cli", "up", "--state-dir", str(state),
                                      "--hosts", "2"], env={**env, "HOLDFAST_ETCD_BIN": "/nonexistent"},
                                     capture_output=True, text=True, timeout=60)
            assert refused.returncode == 69 and said in refused.stderr, refused.stdout + refused.stderr
        # A name the coordinator's certificate may not carry: refused before, not by a traceback after.
        refused = subprocess.run([*CLI, "up", "--state-dir", str(tmp_path / "c" / "state"), "--tls",
                                  "--listen", "agent.holdfast.invalid:0"], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 69 and "agents' own" in refused.stderr, refused.stdout + refused.stderr
        assert sorted(p.name for p in where.iterdir()) == ["dead"] and not (tmp_path / "b").exists()
        assert not (tmp_path / "c").exists()
        assert [p.name for p in dead.iterdir()] == ["up.json"] and (dead / "up.json").read_text() == left
    finally:
        shutil.rmtree(where)


def test_two_ups_cannot_serve_one_address(tmp_path: Path, ups: list[subprocess.Popen[bytes]]) -> None:
    proc, coordinator = start_up(tmp_path / "first", ups)
    second = subprocess.run([*CLI, "up", "--state-dir", str(tmp_path / "second"), "--listen", coordinator],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 69, second.stdout + second.stderr
    assert f"cannot listen on {coordinator} (listen): address in use, held by pid" in second.stderr
    assert second.stderr.count("Next:") == 1, second.stderr  # the coordinator's own, said once
    logged = (tmp_path / "second" / "coordinator.log").read_text().splitlines()
    assert logged and all(json.loads(line)["msg"] for line in logged)  # its last words are JSON too
    holder = int(second.stderr.split("held by pid ", 1)[1].split()[0])
    assert holder in descendants(proc.pid), "the first up's coordinator is named as the holder"
    assert not (tmp_path / "second" / "up.json").exists()
    # The second up stopped the etcd it had started; the first still answers alone.
    status = cli(coordinator, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["hosts"], status.stderr
    stop_up(proc)


def _crash(proc: subprocess.Popen[bytes]) -> None:
    """The whole stack killed at once (kill -9 of up and of everything it started): up.json stays.
    Returns once every one of them is dead (gone, or a zombie awaiting its reaper)."""
    parts = [proc.pid, *descendants(proc.pid)]
    for pid in parts:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)

    def dead(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat[stat.rfind(")") + 2:].split()[0] in ("Z", "X")

    until("the stack to die", lambda: all(dead(pid) for pid in parts), 10)


def test_an_up_after_a_crash_releases_the_registration_of_an_agent_proven_gone(
        tmp_path: Path, ups: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    proc, _ = start_up(state, ups)
    left = json.loads((state / "up.json").read_text())["hosts"][0]
    assert left["lease_id"] and left["agent_pid"] and left["agent_start_ticks"]
    _crash(proc)
    assert (state / "up.json").exists()
    proc, _ = start_up(state, ups)
    out = stop_up(proc)
    assert "released 1 registration(s) left by an `up` that died" in out, out


def test_an_up_after_a_crash_leaves_a_registration_it_cannot_prove_gone(
        tmp_path: Path, ups: list[subprocess.Popen[bytes]]) -> None:
    """up.json names an agent pid that still runs (its start ticks match): never released, said."""
    state = tmp_path / "state"
    proc, _ = start_up(state, ups)
    _crash(proc)
    alive = subprocess.Popen(["sleep", "300"])
    try:
        left = json.loads((state / "up.json").read_text())
        stat = Path(f"/proc/{alive.pid}/stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2:].split()[19])
        left["hosts"][0].update(agent_pid=alive.pid, agent_start_ticks=ticks)
        (state / "up.json").write_text(json.dumps(left))
        proc, _ = start_up(state, ups)
        out = stop_up(proc)
    finally:
        alive.kill()
        alive.wait()
    assert f"(pid {alive.pid}) still runs" in out and "released" not in out, out


# up's wait for a stop signal, in a process with one thread that does not block the stop signals
# (as gRPC's threads in up do not): its id printed, then the wait.
SIGNAL_WAIT = """
import sys, threading
from holdfast.localstack import up

class Stack:
    state_dir = "-"
    def failed(self):
        return ""

parked = threading.Thread(target=threading.Event().wait, daemon=True)
parked.start()
up.block_stop_signals()
print(parked.native_id, flush=True)
sys.exit(up.wait_for_stop(Stack()))
"""


def test_a_stop_signal_taken_by_a_thread_that_does_not_block_it_stops_up_cleanly() -> None:
    """A signal sent to the process lands on any thread that does not block it: up's main thread
    blocks its stop signals to wait for them, gRPC's threads do not. One taken by such a thread
    (tgkill) still stops up cleanly, never as an interrupted Python (130, its parts left running)."""
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_WAIT], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        thread = int(proc.stdout.readline())
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(SYS_TGKILL, proc.pid, thread, signal.SIGINT) == 0, ctypes.get_errno()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and b"SIGINT: stopping" in out, out.decode()
