"""`holdfast run --guard URL` (issue 15) across simulated hosts, with a real SQLite database and a
real Redis: the new fence is in every guarded store before CMD runs; an unreachable store refuses
before anything is asked; a store that cannot take the fence means CMD never runs and the grant is
released."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.client import guards
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster, until
from tests.integration.stores import free_port, redis_server

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]

# CMD: what each guarded store's marker says as CMD starts, against the fence CMD was given.
SEEN = """
import os, sys
from holdfast.client import guards
fence = int(os.environ["HOLDFAST_FENCE"])
with open(sys.argv[1], "w") as out:
    for url in os.environ["HOLDFAST_GUARDS"].split("\\n"):
        guard = guards.open_guard(url)
        out.write(f"{url} {guard.marker(os.environ['HOLDFAST_SESSION'])} {fence}\\n")
        guard.close()
"""


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


def test_every_guarded_store_has_the_fence_before_cmd_runs(cluster: Cluster, tmp_path: Path,
                                                           redis_url: str) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid, seen = "sess-guarded-01", tmp_path / "seen"
    sqlite_url = f"sqlite://{tmp_path / 'app.db'}"
    options = ("--guard", sqlite_url, "--guard", redis_url)
    first = cluster.run(a, sid, *options, cmd=[sys.executable, "-c", SEEN, str(seen)])
    assert first.wait(30) == 0, first.err()
    assert seen.read_text().split("\n")[:2] == [f"{sqlite_url} 1 1", f"{redis_url} 1 1"]
    second = cluster.run(b, sid, *options, cmd=[sys.executable, "-c", SEEN, str(seen)])
    assert second.wait(30) == 0, second.err()
    assert seen.read_text().split("\n")[:2] == [f"{sqlite_url} 2 2", f"{redis_url} 2 2"]
    # The first owner's fence is now refused by the database itself.
    with pytest.raises(guards.StaleFence), guards.sql_write(sqlite3.connect(tmp_path / "app.db"), sid, 1):
        pass


def test_an_unreachable_store_refuses_before_anything_is_asked(cluster: Cluster, tmp_path: Path) -> None:
    a = cluster.host("host-a")
    sid, ran = "sess-guarded-02", tmp_path / "ran"
    run = cluster.run(a, sid, "--guard", f"redis://127.0.0.1:{free_port()}/0", cmd=["touch", str(ran)])
    assert run.wait(30) == 69
    assert "GUARD_UNREACHABLE" in run.err() and "nothing was asked" in run.err()
    assert not ran.exists()
    listing = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10)
    assert sid not in [r.session_id for r in listing.records], "no record was made"


def test_a_store_that_has_seen_a_newer_fence_means_cmd_never_runs(cluster: Cluster, tmp_path: Path) -> None:
    a = cluster.host("host-a")
    sid, ran = "sess-guarded-03", tmp_path / "ran"
    url = f"sqlite://{tmp_path / 'app.db'}"
    newer = guards.open_guard(url)
    newer.bump(sid, 99)  # e.g. another holdfast cluster, or an etcd restored without restore-epoch
    newer.close()
    run = cluster.run(a, sid, "--guard", url, cmd=["touch", str(ran)])
    assert run.wait(30) == 75
    assert "GUARD_FAILED" in run.err() and "fence 99" in run.err()
    assert not ran.exists(), "CMD ran although its fence never reached the store"
    lease = cluster.record(sid).record.lease
    assert lease.fence == 1 and lease.claim_status == pb.RELEASED, "the grant was released"


def test_a_run_refused_held_makes_no_guard_directory(cluster: Cluster, tmp_path: Path) -> None:
    """Guards are opened before the Acquire: a dir:// guard's directories were made then, and a
    SQLite database, or the marker table in one, so a run refused HELD had written them. Made once
    a run is granted, by its bump."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid, ready, go = "sess-guarded-04", tmp_path / "ready", tmp_path / "go"
    os.mkfifo(go)
    holder = cluster.run(a, sid, cmd=["sh", "-c", f'touch "{ready}" && read line < "{go}"'])
    until("the holder's CMD", ready.exists, 30)
    home, app, new = tmp_path / "guarded" / "home", tmp_path / "app.db", tmp_path / "new.db"
    with sqlite3.connect(app) as conn:
        conn.execute("CREATE TABLE app (v TEXT)")
    conn.close()
    before = app.read_bytes()
    options = ("--guard", f"dir://{home}", "--guard", f"sqlite://{app}", "--guard", f"sqlite://{new}")
    refused = cluster.run(b, sid, *options, cmd=["true"])
    assert refused.wait(30) == 75 and "HELD" in refused.err(), refused.err()
    assert not (tmp_path / "guarded").exists(), "a refused run made its guard's directories"
    assert not new.exists() and app.read_bytes() == before, "a refused run wrote in its SQLite guards"
    with open(go, "w") as release:
        release.write("go\n")
    assert holder.wait(30) == 0, holder.err()
    granted = cluster.run(b, sid, *options, cmd=["true"])
    assert granted.wait(30) == 0, granted.err()
    assert os.readlink(home / "current") == "gen-2"
    for db in (app, new):
        with pytest.raises(guards.StaleFence), guards.sql_write(sqlite3.connect(db), sid, 1):
            pass


def test_a_dir_guard_through_a_link_others_may_swap_is_refused_before_anything_is_asked(
        cluster: Cluster, tmp_path: Path) -> None:
    """Root's own link `l` in a root directory any user may write (no sticky bit): the run was
    granted, bumped where `l` led, and CMD — handed the path — wrote wherever another user swapped
    `l` to meanwhile. Refused before the Acquire; nothing made where `l` leads, CMD never ran."""
    a = cluster.host("host-a")
    sid, ran, area, shared = "sess-guarded-05", tmp_path / "ran", tmp_path / "area", tmp_path / "shared"
    area.mkdir(mode=0o700)
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "l").symlink_to(area)
    run = cluster.run(a, sid, "--guard", f"dir://{shared}/l/guard", cmd=["touch", str(ran)])
    assert run.wait(30) == 69, run.err()
    assert "is a link in a directory another user may change" in run.err(), run.err()
    assert "nothing was asked" in run.err()
    assert not ran.exists() and list(area.iterdir()) == []
    listing = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10)
    assert sid not in [r.session_id for r in listing.records], "no record was made"
