"""Grant directories of dead runs are removed by the next run, and nothing else is (issue 15: a run
killed -9 left its 0700 directory with grant.json behind). Real processes, the real /proc."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from holdfast.client import grantdir
from holdfast.client.errors import ClientError
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.common.reasons import Reason
from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import parse_stat
from tests.integration import unprivileged
from tests.integration.run_fixtures import Cluster

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]

NAMESPACE = os.stat("/proc/self/ns/pid").st_ino


def ticks(pid: int) -> int:
    return parse_stat(read_proc_file(f"/proc/{pid}/stat")).start_ticks


def make_run_dir() -> tuple[grantdir.RunDir, int]:
    """A run's grant directory, as `run` makes it once granted, where `place` (before) chose."""
    where = grantdir.place()
    try:
        return grantdir.make(where)
    finally:
        where.close()


def named(base: Path, pid: int, start: int, namespace: int = NAMESPACE) -> Path:
    path = base / f"{grantdir.PREFIX}{namespace}-{pid}-{start}-x1_y"
    path.mkdir(mode=0o700)
    (path / "grant.json").write_text("{}")
    return path


def test_only_dead_runs_of_this_user_and_namespace_are_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen(["sleep", "60"])
    dead_ticks = ticks(dead.pid)
    dead.kill()
    dead.wait()
    me = os.getpid()
    gone = named(tmp_path, dead.pid, dead_ticks)
    reused = named(tmp_path, me, ticks(me) + 1)        # this pid is now another process
    alive = named(tmp_path, me, ticks(me))             # a live run: its CMD reads the grant file
    elsewhere = named(tmp_path, dead.pid, dead_ticks, NAMESPACE + 1)  # another namespace's pid
    plain = tmp_path / f"{grantdir.PREFIX}{NAMESPACE}-{dead.pid}-{dead_ticks}-file"
    plain.write_text("not a directory")
    removed = grantdir.sweep(str(tmp_path))
    assert sorted(removed) == sorted([str(gone), str(reused)])
    assert not gone.exists() and not reused.exists()
    assert alive.exists() and elsewhere.exists() and plain.exists()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user owns needs root")
def test_another_users_directory_is_never_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen(["sleep", "60"])
    dead_ticks = ticks(dead.pid)
    dead.kill()
    dead.wait()
    theirs = named(tmp_path, dead.pid, dead_ticks)
    os.chown(theirs, 65534, 65534)
    assert grantdir.sweep(str(tmp_path)) == []
    assert theirs.exists()


def test_a_run_names_its_directory_so_that_it_survives_sweeps_while_it_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rundir, held = make_run_dir()
    os.close(held)
    os.close(rundir.root)
    made = Path(rundir.path)
    assert made.parent == tmp_path and made.stat().st_mode & 0o777 == 0o700
    assert made.name.startswith(f"{grantdir.PREFIX}{NAMESPACE}-{os.getpid()}-{ticks(os.getpid())}-")
    assert grantdir.sweep(str(tmp_path)) == [] and made.exists()


def test_the_grant_file_is_never_written_through_a_link_in_tmpdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's directory swapped for a link while the Acquire is out (as its owner may in a sticky
    TMPDIR, and anyone could in one without): the grant file, secret inside, is created in the
    directory the run made and holds open, never where the link leads."""
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    elsewhere.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    rundir, held = make_run_dir()
    path = rundir.path
    try:
        os.rename(path, f"{path}.moved")
        os.symlink(elsewhere, path)  # the swap, during the Acquire
        Grant("sess-grantdirs-2", 1, "secret", "token", "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:1").write(held)
    finally:
        os.close(held)
        os.close(rundir.root)
    assert list(elsewhere.iterdir()) == []
    assert Grant.from_file(f"{path}.moved/{GRANT_FILE}").secret == "secret"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_in_a_tmpdir_others_may_rename_in_grant_dirs_are_made_in_a_directory_of_this_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    """Anyone who may write it without the sticky bit (a pod's emptyDir at /tmp is 0777) may rename
    a run's directory away and put a link or their own directory in its place: the run's are made
    in `holdfast-<uid>`, this user's alone, through a descriptor held on it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    rundir, held = make_run_dir()
    os.close(held)
    os.close(rundir.root)
    private = shared / f"holdfast-{os.geteuid()}"
    assert Path(rundir.path).parent == private and os.listdir(shared) == [private.name]
    assert private.stat().st_uid == os.geteuid() and private.stat().st_mode & 0o777 == 0o700
    assert grantdir.sweep() == [] and Path(rundir.path).exists()  # a live run's: found and kept


def test_dead_runs_are_swept_from_this_users_own_named_private_dirs_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that found another user's directory where it was to make `holdfast-<uid>` once granted
    makes a `holdfast-<uid>-<random>` instead: runs killed -9 there are found and swept, by the next
    run and by `sweep`, as in `holdfast-<uid>`."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    dead = subprocess.Popen(["sleep", "60"])
    dead_ticks = ticks(dead.pid)
    dead.kill()
    dead.wait()
    other = shared / f"holdfast-{os.geteuid()}-{os.urandom(6).hex()}"
    other.mkdir(mode=0o700)
    first = named(other, dead.pid, dead_ticks)
    rundir, held = make_run_dir()
    os.close(held)
    os.close(rundir.root)
    assert not first.exists() and Path(rundir.path).exists()
    second = named(other, dead.pid, dead_ticks)
    assert grantdir.sweep() == [str(second)] and Path(rundir.path).exists()


TIME_NS = pytest.mark.skipif(not os.path.exists("/proc/self/ns/time"), reason="this kernel has no time "
                             "namespaces (CONFIG_TIME_NS): no reader's clock is shifted")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --time needs root")
@TIME_NS
def test_under_time_namespace_offsets_no_run_is_judged_by_its_start_ticks(tmp_path: Path) -> None:
    """The review's repro: `sweep` under `unshare --time --boottime 100000` read a live run's start
    100000 s later than its directory's name said, and removed it (its CMD then finds no grant
    file). Under offsets nothing is swept, and a run names its directory for no later run to judge:
    named with shifted ticks, a run without them would find it another process's and remove it."""
    me = os.getpid()
    alive = named(tmp_path, me, ticks(me))
    shifted = ["unshare", "--time", "--kill-child", "--boottime", "100000", sys.executable, "-c"]
    swept = "import sys\nfrom holdfast.client import grantdir\nprint(grantdir.sweep(sys.argv[1]))"
    done = subprocess.run([*shifted, swept, str(tmp_path)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]" and alive.exists()
    made = "from holdfast.client import grantdir\nprint(grantdir.make(grantdir.place())[0].path)"
    (tmp_path / "tmp").mkdir(mode=0o700)
    done = subprocess.run([*shifted, made], capture_output=True, text=True, check=True,
                          env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    name = Path(done.stdout.strip()).name
    assert name.startswith("holdfast-") and not name.startswith(grantdir.PREFIX), name


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user owns needs root")
def test_a_directory_another_user_put_where_this_users_goes_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made before this user's first run (or swapped in since): the run refuses before it asks
    anything, and makes nothing in it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    theirs = shared / "holdfast-0"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with pytest.raises(ClientError) as refused:
        make_run_dir()
    assert refused.value.reason == Reason.INVALID_ARGUMENT
    assert f"{theirs} is not a directory this run may use: not this user's alone (owner uid 65534" \
        in refused.value.message
    assert list(theirs.iterdir()) == []


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to nobody needs root")
@pytest.mark.parametrize("mode,owner,private", [
    (0o777, 0, True),
    (0o1777, 65533, True),  # its owner may rename anything in it, sticky or not
    (0o1777, 0, False),  # as /tmp is: used as it is
])
def test_an_unprivileged_runs_tmpdir_is_judged_alike(mode: int, owner: int, private: bool) -> None:
    tmp = unprivileged.shared_dir("holdfast-tmpdir-")  # pytest's tmp is root-only
    try:
        os.chown(tmp, owner, owner)
        os.chmod(tmp, mode)
        python, extra = unprivileged.interpreter()
        probe = "from holdfast.client import grantdir\nprint(grantdir.make(grantdir.place())[0].path)"
        done = subprocess.run([*unprivileged.DROP, python, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, **extra, "TMPDIR": str(tmp)}, cwd="/")
        assert done.returncode == 0, done.stderr
        made = Path(done.stdout.strip())
        assert made.parent == (tmp / f"holdfast-{unprivileged.NOBODY}" if private else tmp)
        assert made.stat().st_uid == unprivileged.NOBODY
        assert made.parent.stat().st_uid == (unprivileged.NOBODY if private else owner)
    finally:
        shutil.rmtree(tmp)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of group 50's (staff) is made by root")
@pytest.mark.parametrize("below", [False, True])
def test_a_tmpdir_in_or_below_a_directory_others_may_change_is_judged_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, below: bool) -> None:
    """Root's TMPDIR in a root:staff 2775 directory g (staff's members may rename in it) was refused,
    while g itself was used: CMD's path passes through g either way. Both are used: what another
    user can do in g — put a directory of theirs where one of root's was — leaves CMD no grant
    (Grant.from_file), never theirs; the run's own writes go through descriptors."""
    group = tmp_path / "g"
    group.mkdir()
    os.chown(group, 0, 50)
    os.chmod(group, 0o2775)
    tmpdir = group / "rootsub" if below else group
    if below:
        tmpdir.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    rundir, held = make_run_dir()
    os.close(held)
    try:
        assert Path(rundir.path).parent == (tmpdir if below else group / "holdfast-0")
    finally:
        rundir.remove()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to nobody needs root")
def test_an_unprivileged_runs_tmpdir_in_a_home_its_group_may_write_is_used() -> None:
    """nobody's `$HOME/tmp` (its own, 0700) in a 0775 home of group 100 (users: shared) was
    refused; it is used as it is, as a home's own temp directory always was."""
    home = unprivileged.shared_dir("holdfast-home-")
    try:
        os.chown(home, unprivileged.NOBODY, 100)
        os.chmod(home, 0o775)
        (home / "tmp").mkdir(mode=0o700)
        os.chown(home / "tmp", unprivileged.NOBODY, unprivileged.NOBODY)
        python, extra = unprivileged.interpreter()
        probe = "from holdfast.client import grantdir\nprint(grantdir.make(grantdir.place())[0].path)"
        done = subprocess.run([*unprivileged.DROP, python, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, **extra, "TMPDIR": str(home / "tmp")}, cwd="/")
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).parent == home / "tmp"
    finally:
        shutil.rmtree(home)


@pytest.mark.root
def test_a_run_in_a_tmpdir_without_the_sticky_bit_keeps_its_grant_dir_apart(
        cluster: Cluster, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    run = cluster.run(cluster.host("host-grantdirs-tmp"), "sess-grantdirs-3",
                      cmd=["sh", "-c", 'test "${HOLDFAST_GRANT_FILE%/*/grant.json}" = "$TMPDIR/holdfast-0"'],
                      env={"TMPDIR": str(shared)})
    assert run.wait() == 0, run.err()
    assert os.listdir(shared) == ["holdfast-0"] and os.listdir(shared / "holdfast-0") == []


@pytest.mark.root
@pytest.mark.parametrize("as_nobody", [False, True])
def test_a_run_removes_its_grant_dir_where_it_made_it_never_where_a_link_put_meanwhile_leads(
        cluster: Cluster, as_nobody: bool) -> None:
    """In a TMPDIR without the sticky bit, another user renames the run's `holdfast-<uid>` away while
    CMD runs and puts a link in its place, leading to a directory holding one named like the run's:
    the run, ending, removes its own directory, never the one the link leads to (a root run would
    remove it wherever it was; an unprivileged one wherever it may write)."""
    shared = unprivileged.shared_dir("holdfast-grantdirs-")  # nobody's run must reach it too
    cluster.shared.append(shared)
    os.chmod(shared, 0o755)  # nobody's run reaches it; only root may rename in it
    tmpdir, theirs = shared / "tmp", shared / "theirs"
    for made in (tmpdir, theirs):
        made.mkdir()
        os.chmod(made, 0o777)  # no sticky bit: anyone may rename in it
    said, go = shared / "said", shared / "go"
    for fifo in (said, go):
        os.mkfifo(fifo, 0o666)
        os.chmod(fifo, 0o666)
    run = cluster.run(cluster.host("host-grantdirs-link"), "sess-grantdirs-5", as_nobody=as_nobody,
                      cmd=["sh", "-c", 'echo "$HOLDFAST_GRANT_FILE" > "$1" && read -r _ < "$2"', "sh",
                           str(said), str(go)], env={"TMPDIR": str(tmpdir)})
    with open(said) as f:  # CMD runs: its grant directory is made and in use
        grant_file = Path(f.read().strip())
    private = grant_file.parent.parent
    assert private.parent == tmpdir and private.name == f"holdfast-{unprivileged.NOBODY if as_nobody else 0}"
    decoy = theirs / grant_file.parent.name
    decoy.mkdir()
    (decoy / "keep").write_text("theirs")
    os.chown(decoy, unprivileged.NOBODY, unprivileged.NOBODY)  # one the run's user may remove too
    os.chown(decoy / "keep", unprivileged.NOBODY, unprivileged.NOBODY)
    os.rename(private, tmpdir / "moved")
    os.symlink(theirs, private)
    with open(go, "w") as f:
        f.write("end\n")
    assert run.wait() == 0, run.err()
    assert (decoy / "keep").read_text() == "theirs"
    assert os.listdir(tmpdir / "moved") == []  # its own, removed where it was made


def test_an_ended_namespace_loses_the_dirs_of_runs_started_before_its_end(tmp_path: Path) -> None:
    ended, ns = 5_000, NAMESPACE + 7  # a simulated host's namespace, gone at tick 5,000
    before = named(tmp_path, 11, ended - 1, ns)
    later = named(tmp_path, 11, ended, ns)  # a new namespace given the freed inode: a live run's
    elsewhere = named(tmp_path, 11, ended - 1, ns + 1)
    planted = tmp_path / f"{grantdir.PREFIX}{ns}-12-1-link"
    planted.symlink_to(elsewhere)  # named like one, a link: never followed, never removed
    assert grantdir.sweep_ended(ns, ended, str(tmp_path)) == [str(before)]
    assert later.exists() and elsewhere.exists() and planted.is_symlink()


@pytest.mark.root
def test_a_stopped_simulated_host_leaves_no_grant_dir_of_a_run_killed_inside(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # A `run` killed (SIGKILL: a SIGTERM it handles, and removes its directory) while CMD runs
    # leaves its directory for the next run of its pid namespace to sweep; a simulated host's
    # namespace has no next run once stopped.
    monkeypatch.setattr(tempfile, "tempdir", str(cluster.tmp))  # where this cluster's runs keep theirs
    host, sid = cluster.host("host-grantdirs"), "sess-grantdirs-1"
    said = cluster.tmp / "said"
    os.mkfifo(said)
    tell = 'echo "$HOLDFAST_GRANT_FILE" > "$1"; exec sleep 600'
    owner = cluster.run(host, sid, cmd=["sh", "-c", tell, "sh", str(said)])
    with open(said) as f:  # CMD runs: the grant directory is made and in use
        grant_file = Path(f.read().strip())

    def grant_dirs() -> list[Path]:
        return sorted(cluster.tmp.glob(f"{grantdir.PREFIX}*"))

    assert grant_dirs() == [grant_file.parent]
    os.kill(owner.run_pid, signal.SIGKILL)
    owner.wait()
    assert grant_dirs() == [grant_file.parent], "a SIGKILL's death leaves the run's directory"
    host.stop()
    assert grant_dirs() == []
