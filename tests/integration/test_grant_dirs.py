"""Grant directories of dead runs are removed by the next run, and nothing else is (issue 15: a run
killed -9 left its 0700 directory with grant.json behind). Real processes, the real /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import grpc
import pytest

from holdfast.client import grantdir
from holdfast.proc.environ import read_proc_file
from holdfast.proc.procstat import parse_stat
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]

NAMESPACE = os.stat("/proc/self/ns/pid").st_ino


def ticks(pid: int) -> int:
    return parse_stat(read_proc_file(f"/proc/{pid}/stat")).start_ticks


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
    made = Path(grantdir.make())
    assert made.parent == tmp_path and made.stat().st_mode & 0o777 == 0o700
    assert made.name.startswith(f"{grantdir.PREFIX}{NAMESPACE}-{os.getpid()}-{ticks(os.getpid())}-")
    assert grantdir.sweep(str(tmp_path)) == [] and made.exists()


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
    # A `run` killed (SIGKILL: a SIGTERM it handles, and removes its directory) while it waits for
    # its grant leaves its directory for the next run of its pid namespace to sweep; a simulated
    # host's namespace has no next run once stopped.
    monkeypatch.setattr(tempfile, "tempdir", str(cluster.tmp))  # where this cluster's runs keep theirs
    host, sid = cluster.host("host-grantdirs"), "sess-grantdirs-1"
    owner = cluster.run(host, sid, cmd=["sleep", "600"])

    def live() -> bool:
        try:
            return cluster.record(sid).record.lease.claim_status == pb.LIVE
        except grpc.RpcError:  # no record yet
            return False

    until("the owner live", live)
    waiter = cluster.run(host, sid, "--wait", "60")

    def grant_dirs() -> list[Path]:
        return sorted(cluster.tmp.glob(f"{grantdir.PREFIX}*"))

    until("the waiter's grant directory", lambda: len(grant_dirs()) == 2)
    os.kill(waiter.run_pid, signal.SIGKILL)
    waiter.wait()
    assert len(grant_dirs()) == 2, "a SIGKILL's death leaves the waiter's directory"
    host.stop()
    owner.wait()
    assert grant_dirs() == []
