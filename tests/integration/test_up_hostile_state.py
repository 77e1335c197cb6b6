"""A root `holdfast up` on a state directory another user (nobody) made or may write: it refuses,
saying what is wrong and what to do, and writes nothing through a link planted there — the file a
link names is byte-equal after, a path it names still absent — nor trusts a CA planted there."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from holdfast.common import certs
from holdfast.localstack.up import _start_ticks
from tests.acls import grant
from tests.integration.conftest import descendants
from tests.integration.run_fixtures import until
from tests.integration.test_up import start_up, stop_up, ups  # noqa: F401 - ups: a fixture
from tests.integration.unprivileged import DROP, NOBODY, shared_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the planter is another user (nobody)")

CLI = [sys.executable, "-m", "holdfast.cli"]
# (where nobody plants, root's victim) -> (the state dir, what must not change)
Plant = Callable[[Path, Path], tuple[Path, Path]]


def as_nobody(*argv: str) -> None:
    subprocess.run([*DROP, *argv], check=True)


def snapshot(path: Path) -> object:
    """What is at `path` (not following a link there): a file's bytes, a directory's every entry
    and its mtime — which an entry made and removed again, between two looks, changes."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        entries = sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else b"")
                         for p in path.rglob("*"))
        return path.stat().st_mtime_ns, entries
    return path.read_bytes() if path.exists() else None


@pytest.fixture
def planter() -> Iterator[Path]:
    """A directory anybody may write, sticky as /tmp (none may rename another's entry), where nobody
    makes the state directory or its parts."""
    where = shared_dir("holdfast-planted-")
    where.chmod(0o1777)
    yield where
    shutil.rmtree(where)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Root's own: a root-only file, and beside it a root-only directory."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    target = private / "victim"
    target.write_bytes(b"root's secret\n")
    target.chmod(0o600)
    return target


def their_state_dir(planter: Path) -> Path:
    state = planter / "state"
    as_nobody("mkdir", "-m", "0755", str(state))
    return state


def link_up_lock(planter: Path, victim: Path) -> tuple[Path, Path]:
    state = their_state_dir(planter)
    as_nobody("ln", "-s", str(victim), str(state / "up.lock"))
    return state, victim


def link_ports(planter: Path, victim: Path) -> tuple[Path, Path]:
    state = their_state_dir(planter)
    made = victim.parent / "made-by-root"
    as_nobody("ln", "-s", str(made), str(state / "etcd-ports.json"))
    return state, made


def link_log(planter: Path, victim: Path) -> tuple[Path, Path]:
    state = their_state_dir(planter)
    as_nobody("ln", "-s", str(victim), str(state / "coordinator.log"))
    return state, victim


def link_state_dir(planter: Path, victim: Path) -> tuple[Path, Path]:
    state = planter / "state"
    as_nobody("ln", "-s", str(victim.parent), str(state))
    return state, victim.parent


def others_may_write(planter: Path, victim: Path) -> tuple[Path, Path]:
    """Root's own state directory, but one anybody may write: nobody plants a link in it."""
    state = planter / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    as_nobody("ln", "-s", str(victim), str(state / "up.lock"))
    return state, victim


def swappable_parent(planter: Path, victim: Path) -> tuple[Path, Path]:
    """Root's own private state directory, in a directory anybody may write and not sticky: nobody
    could rename it away and put a link at its name while etcd, the coordinator and the agents
    write to paths through it."""
    open_to_all = planter / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    state = open_to_all / "state"
    state.mkdir(mode=0o700)
    return state, state


def acl_parent(planter: Path, victim: Path) -> tuple[Path, Path]:
    """Root's own private state directory in a root:root 0o755 directory whose ACL lets nobody
    write it (`setfacl -m u:nobody:rwx`, drwxrwxr-x+): its group bits are the ACL's mask, not
    root's group's, and nobody could rename the state directory away and put a link there."""
    shared = planter / "shared"
    shared.mkdir(mode=0o755)
    grant(shared, NOBODY)
    state = shared / "state"
    state.mkdir(mode=0o700)
    return state, state


def default_acl_parent(planter: Path, victim: Path) -> tuple[Path, Path]:
    """A root:root 0o755 directory whose default ACL lets nobody write what is made in it
    (`setfacl -d -m u:nobody:rwx`): a state directory made there would pass that on to etcd's
    files, the logs and the certificates, whatever `up`'s umask. None is made, not even for a
    moment: its mtime, set in the past, says so."""
    shared = planter / "shared"
    shared.mkdir(mode=0o755)
    grant(shared, NOBODY, default=True)
    os.utime(shared, ns=(1, 1))
    return shared / "state", shared


def their_etcd_dir(planter: Path, victim: Path) -> tuple[Path, Path]:
    """Root's own state directory 0o755, holding an etcd data directory that is nobody's (left from
    when it was theirs) with its log a link to a path of theirs choosing."""
    state = planter / "state"
    state.mkdir(mode=0o755)
    (state / "etcd").mkdir(mode=0o755)
    os.chown(state / "etcd", NOBODY, NOBODY)
    made = victim.parent / "made-by-etcd"
    as_nobody("ln", "-s", str(made), str(state / "etcd" / "etcd.log"))
    return state, made


def their_ca(planter: Path, victim: Path) -> tuple[Path, Path]:
    """A state directory of theirs with a CA of theirs in tls/: whoever holds ca.key would mint
    any certificate the stack trusts (an operator's of every tenant)."""
    state = their_state_dir(planter)
    certs.init_ca(planter / "ca")  # made where root's certs may write, then handed over as theirs
    os.rename(planter / "ca", state / "tls")
    for path in [state / "tls", *(state / "tls").iterdir()]:
        os.chown(path, NOBODY, NOBODY)
    return state, state / "tls"


@pytest.mark.parametrize("plant", [link_up_lock, link_ports, link_log, link_state_dir, others_may_write,
                                   swappable_parent, acl_parent, default_acl_parent, their_etcd_dir,
                                   their_ca])
def test_up_refuses_a_state_dir_another_user_controls_and_writes_nothing_through_it(
        plant: Plant, planter: Path, victim: Path, tmp_path: Path) -> None:
    assert_refused(*plant(planter, victim), tmp_path)


def test_up_refuses_a_state_dir_in_one_a_group_of_other_users_may_write(planter: Path,
                                                                       tmp_path: Path) -> None:
    """A root `up` whose group is nogroup (65534), as a user's whose primary group is `users` is
    shared: the parent, root's and group-writable for that group, is also nobody's (whose primary
    group it is) to rename the state directory in."""
    shared = planter / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    os.chown(shared, 0, NOBODY)
    state = shared / "state"
    state.mkdir(mode=0o700)
    assert_refused(state, state, tmp_path, ["setpriv", f"--regid={NOBODY}", "--clear-groups", "--"])


def assert_refused(state: Path, target: Path, tmp_path: Path, prefix: Sequence[str] = ()) -> None:
    """`up --state-dir state`, run after `prefix`, refuses at once, changing neither the state
    directory nor `target`, with one line saying why and what to do."""
    before, was = snapshot(target), snapshot(state)
    argv = [*prefix, *CLI, "up", "--tls", "--state-dir", str(state), "--listen", "127.0.0.1:0"]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")})
    try:
        # Refused at once; what the current code did instead shows as a change at the target.
        until("up to refuse", lambda: up.poll() is not None or snapshot(target) != before, timeout=60)
    finally:
        if up.poll() is None:  # the current code's stack, started through the planted state
            for pid in [*descendants(up.pid), up.pid]:
                os.kill(pid, signal.SIGKILL)
        _, err = up.communicate(timeout=30)
    assert snapshot(target) == before
    assert snapshot(state) == was
    assert up.returncode == 69, err
    assert "nothing was changed" in err, err
    assert "Next: pass another --state-dir (or, as its owner, remove or fix it)" in err, err
    assert len(err.splitlines()) == 1, err


def test_exec_enters_no_process_a_state_dir_of_another_user_names(planter: Path, tmp_path: Path) -> None:
    """Their up.json names a host whose reaper is a process of root's (this test): a root `exec`
    would run CMD in its namespaces, as root. It refuses, and CMD never runs."""
    state = their_state_dir(planter)
    me = os.getpid()
    host = {"n": 1, "host_id": "host-1", "reaper_pid": me, "reaper_start_ticks": _start_ticks(me)}
    up_json = json.dumps({"coordinator": "127.0.0.1:9", "tls_dir": "", "hosts": [host]})
    as_nobody("sh", "-c", f"printf '%s' '{up_json}' > {state / 'up.json'}")
    ran = tmp_path / "ran"
    done = subprocess.run([*CLI, "exec", "--host", "1", "--state-dir", str(state), "--", "touch", str(ran)],
                          capture_output=True, text=True, timeout=60)
    assert not ran.exists()
    assert done.returncode == 69, done.stderr
    assert f"no `holdfast up` of uid 0 with state in {state}" in done.stderr


def test_up_under_umask_002_uses_its_own_state_dir_again(
        tmp_path: Path, ups: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The normal case: nothing `up --tls` makes is group-writable, whatever the umask (002 made its
    certificates 0664), so a second `up` accepts the state directory the first one made."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    state = tmp_path / "state"
    old = os.umask(0o002)
    try:
        for _ in range(2):
            proc, _ = start_up(state, ups, "127.0.0.1:0", "--tls")
            stop_up(proc)
    finally:
        os.umask(old)
