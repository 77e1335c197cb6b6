"""A run's grant file against links and directories another user controls, and the run's refusals
writing nothing: root runs `holdfast run`, nobody (a real process, setpriv) plants what it may.
The temp directory is reached through no link another user made, refused before anything is
asked when it cannot be; CMD gets its grant file by a path through no link; the grant directory is
made, and dead runs' swept, only once granted; `put` takes no other session's grant from its
environment; a host id that is none is refused before anything is made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from holdfast.client import grantdir
from holdfast.client.grant import Grant
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.run_fixtures import Cluster, Run

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]

NOWHERE = "127.0.0.1:9"  # nothing listens: a command that asks anything fails UNAVAILABLE (69)


def as_nobody(script: str, *args: str) -> None:
    subprocess.run([*unprivileged.DROP, "sh", "-c", script, "sh", *args], check=True, cwd="/")


def cli(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """`holdfast ARGV` in an environment of no enclosing run's, with `extra` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
    return subprocess.run([sys.executable, "-m", "holdfast.cli", *argv], capture_output=True, text=True,
                          env={**env, "HOLDFAST_COORDINATOR": NOWHERE, **extra}, timeout=60)


@pytest.mark.root
@pytest.mark.parametrize("planted", ["their home's link to /tmp", "their link in /tmp to root's directory"])
def test_a_tmpdir_through_another_users_link_is_refused_before_anything_is_asked(
        cluster: Cluster, tmp_path: Path, planted: str) -> None:
    """Through their link the run made its grant directory where they chose, and told CMD a path
    through it, which they could later point at another session's grant directory (then CMD wrote
    as that session's owner: two writers)."""
    theirs = Path(f"/tmp/holdfast-rvw-{os.urandom(6).hex()}")
    rootonly = tmp_path / "rootonly"
    rootonly.mkdir(mode=0o700)
    if planted.startswith("their home"):
        as_nobody('mkdir -m 755 "$1" && ln -s /tmp "$1/tmp"', str(theirs))
        tmpdir = theirs / "tmp"
    else:
        as_nobody('ln -s "$2" "$1"', str(theirs), str(rootonly))
        tmpdir = theirs
    try:
        sid = "sess-grantdir-linked"
        host = cluster.host("host-grantdir-linked")
        run = cluster.run(host, sid, cmd=["true"], env={"TMPDIR": str(tmpdir)})
        assert run.wait() == 2, run.err()
        assert "nothing was made, nor a grant asked for" in run.err() and "set TMPDIR" in run.err()
        assert run.err().count("Next:") == 1, run.err()  # the fix, not the generic one after it
        with pytest.raises(grpc.RpcError) as unknown:
            cluster.record(sid)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert os.listdir(rootonly) == []
    finally:
        if theirs.is_symlink():
            theirs.unlink()
        else:
            shutil.rmtree(theirs)


@pytest.mark.root
def test_cmd_is_given_its_grant_file_by_a_path_through_no_link(cluster: Cluster, tmp_path: Path) -> None:
    """A link of root's own in root's directory is followed; CMD is told the path it led to, which
    no one else can make lead elsewhere later, and writes with the grant found there."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "via").symlink_to(real)
    check = 'case "$HOLDFAST_GRANT_FILE" in "$1"/holdfast-run-*/grant.json) shift; exec "$@";; esac; exit 9'
    put = [sys.executable, "-m", "holdfast.cli", "put", "where", "real"]
    run = cluster.run(cluster.host("host-grantdir-real"), "sess-grantdir-real",
                      cmd=["sh", "-c", check, "sh", str(real), *put], env={"TMPDIR": str(tmp_path / "via")})
    assert run.wait() == 0, run.err()


@pytest.mark.root
def test_a_refused_run_makes_nothing_and_sweeps_nothing_in_its_tmpdir(
        cluster: Cluster, tmp_path: Path) -> None:
    """In a TMPDIR others may rename in (0777, no sticky bit) a run keeps its grant directory in
    `holdfast-0`, which a refused run made and left; and it removed dead runs' directories."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    host, sid, said = cluster.host("host-grantdir-refused"), "sess-grantdir-refused", tmp_path / "said"
    os.mkfifo(said)
    owner = cluster.run(host, sid, cmd=["sh", "-c", 'echo up > "$1"; exec sleep 600', "sh", str(said)])
    with open(said) as f:  # the session is held
        f.read()
    refused = cluster.run(host, sid, cmd=["true"], env={"TMPDIR": str(shared)})
    assert refused.wait() == 75, refused.err()
    assert os.listdir(shared) == []
    private = shared / "holdfast-0"
    private.mkdir(mode=0o700)
    namespace = os.stat(f"/proc/{owner.run_pid}/ns/pid").st_ino  # the simulated host's: its runs' names
    dead = private / f"{grantdir.PREFIX}{namespace}-999999-1-x"  # its pid is no process's
    dead.mkdir(mode=0o700)
    refused = cluster.run(host, sid, cmd=["true"], env={"TMPDIR": str(shared)})
    assert refused.wait() == 75, refused.err()
    assert os.listdir(private) == [dead.name]
    granted = cluster.run(host, "sess-grantdir-granted", cmd=["true"], env={"TMPDIR": str(shared)})
    assert granted.wait() == 0, granted.err()
    assert os.listdir(private) == [], "once granted, a run sweeps what the refused ones left alone"


# An `unshare -m` whose /tmp is the same directory, read-only: a pod's readOnlyRootFilesystem.
READ_ONLY_TMP = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && exec "$@"', "sh"]


def refused_before_asking(run: Run, named: str) -> None:
    assert run.wait() == 2, run.err()
    said = run.err()
    assert f"in the temp directory ({named}: TMPDIR, else /tmp)" in said, said
    assert "nothing was made, nor a grant asked for" in said and "Traceback" not in said


@pytest.mark.root
@pytest.mark.parametrize("where", ["/usr, as nobody", "a read-only /tmp, TMPDIR unset"])
def test_a_tmpdir_the_run_may_not_write_is_refused_before_anything_is_asked(
        cluster: Cluster, where: str) -> None:
    """The run was granted first, then failed making its grant directory (a traceback, rc 1): a
    grant taken, and released, for a run that could never start."""
    sid, host = "sess-grantdir-unwritable", cluster.host("host-grantdir-unwritable")
    if where.startswith("/usr"):
        run = cluster.run(host, sid, cmd=["true"], as_nobody=True, env={"TMPDIR": "/usr"})
        refused_before_asking(run, "/usr")
        assert "uid 65534 may not write and search it" in run.err()
    else:
        unset = {"TMPDIR": "", "TEMP": "", "TMP": ""}
        run = cluster.run(host, sid, cmd=["true"], env=unset, wrap=READ_ONLY_TMP)
        refused_before_asking(run, "/tmp")
        assert "its file system is read-only" in run.err()
    with pytest.raises(grpc.RpcError) as unknown:
        cluster.record(sid)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.root
def test_a_takeover_whose_tmpdir_it_may_not_write_ends_no_owner(cluster: Cluster, tmp_path: Path) -> None:
    """The takeover's handoff ended the owner's CMD, and only then did making its grant directory
    fail: an owner ended for a run that could never start."""
    sid, said = "sess-grantdir-takeover-unwritable", tmp_path / "said"
    os.mkfifo(said)
    owner = cluster.run(cluster.host("host-grantdir-owner"), sid,
                        cmd=["sh", "-c", 'echo up > "$1"; exec sleep 600', "sh", str(said)])
    with open(said) as f:  # CMD runs
        f.read()
    before = cluster.record(sid).record.lease
    taker = cluster.run(cluster.host("host-grantdir-taker"), sid, "--takeover", "--handoff-timeout", "60",
                        cmd=["true"], as_nobody=True, env={"TMPDIR": "/usr"})
    refused_before_asking(taker, "/usr")
    after = cluster.record(sid).record.lease
    assert (after.fence, after.claim_status, after.handoff_stage) == \
        (before.fence, before.claim_status, before.handoff_stage)
    assert after.fence == 1 and after.handoff_stage not in (pb.HANDOFF_REQUESTED, pb.FORCE_PENDING)
    assert owner.proc.poll() is None and "handoff requested" not in owner.err(), owner.err()


@pytest.mark.root
@pytest.mark.parametrize("meanwhile", ["made", "swapped"])
def test_what_another_user_does_in_tmpdir_while_a_takeover_waits_fails_no_granted_run(
        cluster: Cluster, meanwhile: str) -> None:
    """What place() saw can change before the grant: while the takeover waits for the owner to end,
    another user makes `holdfast-0` where there was none ("made"), or renames root's away and makes
    theirs in its place ("swapped") in a TMPDIR anyone may write (no sticky bit). make() opened
    `holdfast-0` again by its name, found theirs, and failed GRANT_DIR_FAILED after the takeover had
    ended the previous owner: any user could end a session's owner and leave the session ownerless.
    Now the run's directory is made in the `holdfast-0` place() held ("swapped": wherever they moved
    it), or in a `holdfast-0-<random>` of its own ("made"), and CMD runs with its grant."""
    shared = unprivileged.shared_dir("holdfast-grantdir-raced-")  # 0777, no sticky bit
    cluster.shared.append(shared)
    said, go = shared / "said", shared / "go"
    for fifo in (said, go):
        os.mkfifo(fifo, 0o600)
    if meanwhile == "swapped":
        (shared / "holdfast-0").mkdir(mode=0o700)
    sid = f"sess-grantdir-{meanwhile}"
    ending = 'trap \'echo ending > "$1"; read -r _ < "$2"; exit 0\' TERM; echo up > "$1"; sleep 600 & wait $!'
    owner = cluster.run(cluster.host(f"host-grantdir-{meanwhile}-a"), sid,
                        cmd=["sh", "-c", ending, "sh", str(said), str(go)])
    with open(said) as f:  # CMD runs
        f.read()
    put = [sys.executable, "-m", "holdfast.cli", "put", "where", "taken"]
    taker = cluster.run(cluster.host(f"host-grantdir-{meanwhile}-b"), sid, "--takeover", "--handoff-timeout",
                        "60", cmd=put, env={"TMPDIR": str(shared)})
    with open(said) as f:  # the handoff is asked: the taker's place() is behind it
        assert f.read().strip() == "ending"
    if meanwhile == "swapped":
        as_nobody('mv "$1/holdfast-0" "$1/gone" && mkdir -m 700 "$1/holdfast-0"', str(shared))
    else:
        as_nobody('mkdir -m 700 "$1/holdfast-0"', str(shared))
    with open(go, "w") as f:
        f.write("end\n")
    owner.wait()
    assert taker.wait() == 0, taker.err()  # CMD wrote with its grant, read from its grant file
    assert "GRANT_DIR_FAILED" not in taker.err()
    lease = cluster.record(sid).record.lease
    assert (lease.fence, lease.claim_status) == (2, pb.RELEASED)
    assert os.listdir(shared / "holdfast-0") == [], "nothing of the run's is in theirs"
    if meanwhile == "swapped":
        assert os.listdir(shared / "gone") == []  # the run's own directory, removed at its end
    else:
        made = [name for name in os.listdir(shared) if name.startswith("holdfast-0-")]
        assert len(made) == 1 and os.stat(shared / made[0]).st_uid == 0, os.listdir(shared)
        assert os.listdir(shared / made[0]) == []


def test_put_takes_no_other_sessions_grant_from_its_environment(tmp_path: Path) -> None:
    """HOLDFAST_GRANT_FILE and HOLDFAST_SESSION are set by the same `run`: a grant of another
    session found at that path (its directory replaced meanwhile) is not this CMD's. A grant file
    named with --grant-file is the caller's own choice, and is used."""
    directory = tmp_path / "grant"
    directory.mkdir(mode=0o700)
    held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        Grant("sess-grantdir-other", 3, "secret", "token", "HOLDFAST_SPAWN_TOKEN", NOWHERE).write(held)
    finally:
        os.close(held)
    path = str(directory / "grant.json")
    mine = {"HOLDFAST_GRANT_FILE": path, "HOLDFAST_SESSION": "sess-grantdir-mine"}
    done = cli("put", "k", "v", **mine)
    assert done.returncode == 2, done.stderr
    assert "grant of session 'sess-grantdir-other', but this CMD runs for session 'sess-grantdir-mine'" \
        in done.stderr
    asked = cli("put", "--grant-file", path, "k", "v", **mine)
    assert asked.returncode == 69, asked.stderr  # asked: nothing listens there
    assert cli("put", "k", "v", HOLDFAST_GRANT_FILE=path).returncode == 69  # no session said: asked too


@pytest.mark.parametrize("given", [("--host-id", "a/b"), ("HOLDFAST_HOST_ID", "a/b")])
def test_a_host_id_that_is_no_host_id_is_refused_before_anything_is_made(
        tmp_path: Path, given: tuple[str, str]) -> None:
    """A takeover keeps its operation id in a file named for the host id: one with a '/' ended in a
    traceback (rc 1) after making the directory it was to go in."""
    (tmp_path / "tmp").mkdir()
    where, value = given
    option = [where, value] if where.startswith("--") else []
    extra = {} if option else {where: value}
    done = cli("run", "--takeover", *option, "--session", "sess-grantdir-hostid", "--", "true",
               XDG_STATE_HOME=str(tmp_path / "state"), TMPDIR=str(tmp_path / "tmp"), **extra)
    assert done.returncode == 2, done.stderr
    assert f"{where}: host id {value!r} must match" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists() and os.listdir(tmp_path / "tmp") == []
