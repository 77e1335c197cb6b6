"""`holdfast run --carry PATH` (issue 15) across simulated hosts, each with its own working
directory standing in for its own disk: the session's files arrive on the next host before its CMD
runs, a handoff carries the state the old owner left at its end, a superseded owner's upload is
refused by the fence, and bad input — a path that does not exist, an over-cap directory, a corrupt
chunk — is a clear error that keeps the last good copy and writes nothing in place (hostile
manifests: test_carry_hostile.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common.reasons import reason_of
from holdfast.coordinator.store import Store
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.conftest import descendants
from tests.integration.coordinator_fixtures import Coordinator, snapshot
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
CAP = 1 << 20


@pytest.fixture
def coordinator(etcd, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:  # type: ignore[no-untyped-def]
    """This module's coordinator keeps carried state of at most 1 MiB a session."""
    server = Coordinator(etcd.url, tmp_path, prefix, args=("--carry-session-cap-bytes", str(CAP))).start()
    try:
        yield server
    finally:
        server.stop()


def homes(tmp_path: Path, *names: str) -> list[Path]:
    made = []
    for name in names:
        (tmp_path / name).mkdir()
        made.append(tmp_path / name)
    return made


def carry_of(cluster: Cluster, sid: str) -> pb.GetCarryResponse:
    return cluster.stub.GetCarry(pb.GetCarryRequest(session_id=sid), timeout=10)


WRITE = (
    "mkdir -p state/sub && printf v1 > state/notes && printf 'echo hi' > state/sub/run.sh && "
    "chmod 750 state/sub/run.sh && ln -s sub/run.sh state/link"
)
READ = "{ cat state/notes; echo; stat -c %a state/sub/run.sh; readlink state/link; } > seen"


def test_state_moves_to_the_next_host_before_its_cmd_runs(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    sid = "sess-carry-01"
    first = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", WRITE], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    assert "carried state (9 bytes) at fence 1" in first.err()
    manifest = carry_of(cluster, sid).manifest
    assert (manifest.fence, manifest.host_id, manifest.reason) == (1, "host-a", "release")
    second = cluster.run(b, sid, "--carry", "state", cmd=["sh", "-c", READ], cwd=home_b)
    assert second.wait(30) == 0, second.err()
    # CMD on host b read what host a's CMD wrote: restored before it ran, modes and links kept.
    assert (home_b / "seen").read_text().split("\n") == ["v1", "750", "sub/run.sh", ""]
    assert "restored state (2 files, 9 bytes) carried at fence 1 from host host-a on release" in second.err()
    assert not [p for p in home_b.iterdir() if ".holdfast-" in p.name], "no temporary directory left behind"
    # `holdfast show` says what the session carries, and which grant wrote it.
    shown = subprocess.run([sys.executable, "-m", "holdfast.cli", "show", sid, "--json"], capture_output=True,
                           env=cluster.env(b), check=True)
    carried = json.loads(shown.stdout)["carried"]
    assert (carried["fence"], carried["host_id"], carried["reason"]) == (2, "host-b", "release")
    assert carried["roots"] == [{"path": "state", "files": 2, "bytes": 9}]
    # And what its uploads reserve against: both copies (one a slot), its tenant's and the cluster's.
    assert json.loads(shown.stdout)["carry_budget"] == {
        "tenant": "default", "tenant_reserved_bytes": 18, "tenant_budget_bytes": 0, "reserved_bytes": 18,
        "budget_bytes": 512 << 20}
    text = subprocess.run([sys.executable, "-m", "holdfast.cli", "show", sid], capture_output=True, text=True,
                          env=cluster.env(b), check=True).stdout
    assert "carried state: state (2 files, 9 bytes) carried at fence 2 from host host-b on release" in text
    assert "carry budget: tenant default 18 bytes (no per-tenant limit); cluster 18 of 536870912" in text


TAKEN_OVER = (
    "trap 'printf final > state/notes; exit 0' TERM; printf started > state/notes; touch up; "
    "while :; do sleep 1 & wait $!; done"
)


def test_a_takeover_restores_what_the_old_owner_left_at_its_end(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    sid = "sess-carry-02"
    owner = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", TAKEN_OVER], cwd=home_a)
    until("the owner's CMD running", (home_a / "up").exists)
    taker = cluster.run(
        b, sid, "--takeover", "--carry", "state", cmd=["sh", "-c", "cat state/notes > seen"], cwd=home_b
    )
    assert taker.wait(60) == 0, taker.err()
    assert owner.wait(30) == 0, owner.err()
    # The old owner's tree ended, then it uploaded, then released: the taker waited for that rather
    # than take the session while the upload was still on its way.
    assert (home_b / "seen").read_text() == "final"
    assert "on handoff" in taker.err()
    lease = cluster.record(sid).record.lease
    assert lease.fence == 2 and carry_of(cluster, sid).manifest.fence == 2


def test_a_superseded_owner_cannot_upload(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    (home_a / "state" / "notes").write_text("from a")
    sid = "sess-carry-03"
    keep = 'cp "$HOLDFAST_GRANT_FILE" grant.json; touch up; exec sleep 300'
    owner = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", keep], cwd=home_a)
    until("the owner's CMD running", (home_a / "up").exists)
    cluster.run(b, sid, "--takeover", "--carry", "state", cmd=["sh", "-c", keep], cwd=home_b)
    until("the taker's CMD running", (home_b / "up").exists)
    assert owner.wait(30) == 128 + 15, owner.err()  # its sleep took the handoff's SIGTERM
    old, new = Grant.from_file(home_a / "grant.json"), Grant.from_file(home_b / "grant.json")
    assert (old.fence, new.fence) == (1, 2)

    async def attempts() -> list[str]:
        refused = []
        async with Client(cluster.coordinator.address, "host-a") as client:
            for call in (
                lambda: client.begin_carry(old, 6, 1),
                lambda: client.put_carry_chunk(old, 1, 0, b"stale!"),
                lambda: client.begin_carry(Grant(sid, 2, old.secret, "", "", old.coordinator), 6, 1),
                # The files themselves are the owner's only: not its predecessor's, not a reader's.
                lambda: client.get_carry_chunk(old, 0, 0),
                lambda: client.get_carry_chunk(Grant(sid, 2, old.secret, "", "", old.coordinator), 0, 0),
            ):
                with pytest.raises(ClientError) as caught:
                    await call()
                refused.append(caught.value.reason)
        return refused

    assert asyncio.run(attempts()) == ["STALE_FENCE", "STALE_FENCE", "PERMISSION_DENIED", "STALE_FENCE",
                                       "PERMISSION_DENIED"]
    with pytest.raises(grpc.RpcError) as no_grant:
        cluster.stub.GetCarry(pb.GetCarryRequest(session_id=sid, with_chunk=True), timeout=10)
    assert no_grant.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(carry_of(cluster, sid).manifest.chunk_sha256) == 1, "the manifest stays readable to any reader"
    manifest = carry_of(cluster, sid).manifest
    assert (manifest.fence, manifest.reason) == (1, "handoff"), "the handed-over copy stands"


def test_bad_paths_are_refused_before_anything_is_asked(cluster: Cluster, tmp_path: Path) -> None:
    a = cluster.host("host-a")
    (home,) = homes(tmp_path, "home-a")
    (home / "big").mkdir()
    (home / "big" / "blob").write_bytes(os.urandom(CAP + 1))
    sid = "sess-carry-04"
    missing = cluster.run(a, sid, "--carry", "no-dir/nothing-here", cmd=["touch", "ran"], cwd=home)
    assert missing.wait(30) == 2
    assert "--carry no-dir/nothing-here: no such file or directory here" in missing.err()
    assert f"its directory {home}/no-dir cannot be used" in missing.err()
    os.symlink("big", home / "link")
    linked = cluster.run(a, sid, "--carry", "link", cmd=["touch", "ran"], cwd=home)
    assert linked.wait(30) == 2
    assert "--carry link: not a regular file or a directory" in linked.err()
    over = cluster.run(a, sid, "--carry", "big", cmd=["touch", "ran"], cwd=home)
    assert over.wait(30) == 2
    assert "CARRY_TOO_LARGE" in over.err() and f"cap of {CAP} bytes" in over.err()
    assert not (home / "ran").exists()
    listing = cluster.stub.ListSessions(pb.ListSessionsRequest(), timeout=10)
    assert sid not in [r.session_id for r in listing.records], "nothing was asked: no record was made"


def test_a_sparse_file_over_the_cap_is_refused_unread_and_the_session_released(
    cluster: Cluster, tmp_path: Path
) -> None:
    """CMD leaves a 3 GB sparse file (4 KB on disk) in a carried directory: packing read it whole
    before any cap, so a `run` under a memory limit died of MemoryError with the session left live.
    It is refused by its size, naming the cap's setting, unread, and the session is released."""
    a = cluster.host("host-a")
    (home,) = homes(tmp_path, "home-a")
    (home / "state").mkdir()
    sid = "sess-carry-sparse"
    cmd = ["/usr/bin/truncate", "-s", "3G", str(home / "state" / "sparse-run")]
    # Run as root (as_nobody only for its prefix) with 2 GB of address space: the host's memory.
    run = cluster.run(a, sid, "--carry", "state", cmd=cmd, cwd=home, as_nobody=True,
                      drop=["prlimit", "--as=2000000000", "--"], env={"TMPDIR": str(tmp_path)})
    assert run.wait(60) == 0, run.err()
    assert "carried state not uploaded (CARRY_TOO_LARGE)" in run.err(), run.err()
    assert f"cap of {CAP} bytes (carry_session_cap_bytes)" in run.err() and "state/sparse-run" in run.err()
    lease = cluster.record(sid).record.lease
    assert lease.claim_status == pb.RELEASED, "released, never left live by a state directory too big"
    assert not carry_of(cluster, sid).found, "nothing was stored"


def test_a_path_that_does_not_exist_yet_is_carried_if_cmd_makes_it(cluster: Cluster, tmp_path: Path) -> None:
    """On a first run there is nothing to restore; at the end the root is uploaded only if CMD made
    a plain file or directory there, in the directory it had at the start or one CMD put in its place
    where no other user may change anything (test_carry_hostile: where one may)."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b, home_c, home_d = homes(tmp_path, "home-a", "home-b", "home-c", "home-d")
    nothing = cluster.run(a, "sess-carry-new-0", "--carry", "state", cmd=["true"], cwd=home_a)
    assert nothing.wait(30) == 0, nothing.err()
    assert "state: CMD did not create it; not carried" in nothing.err()
    assert not carry_of(cluster, "sess-carry-new-0").found, "nothing was uploaded"
    first = cluster.run(a, "sess-carry-new-1", "--carry", "state", cmd=["sh", "-c", WRITE], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    second = cluster.run(b, "sess-carry-new-1", "--carry", "state", cmd=["cat", "state/notes"], cwd=home_b)
    assert second.wait(30) == 0, second.err()
    assert (home_b / "state" / "notes").read_text() == "v1"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret").write_text("not to be carried")
    linked = cluster.run(a, "sess-carry-new-2", "--carry", "state", cmd=["ln", "-s", "../elsewhere", "state"],
                         cwd=home_c)
    assert linked.wait(30) == 0, linked.err()
    assert "state: not a regular file or a directory" in linked.err()
    assert not carry_of(cluster, "sess-carry-new-2").found
    # CMD swaps the directory for another, and makes the root in the new one: its own, in root's place.
    swap = "mv ../home-d ../home-d.old && mkdir ../home-d ../home-d/state && touch ../home-d/state/f"
    swapped = cluster.run(a, "sess-carry-new-3", "--carry", str(home_d / "state"), cmd=["sh", "-c", swap],
                          cwd=home_d)
    assert swapped.wait(30) == 0, swapped.err()
    assert "carried state not uploaded" not in swapped.err(), swapped.err()
    assert [(e.path, e.kind) for e in carry_of(cluster, "sess-carry-new-3").manifest.entries] == [
        ("", "dir"), ("f", "file")]


def test_a_corrupt_chunk_is_refused_and_the_local_files_are_kept(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    (home_b / "state").mkdir()
    (home_b / "state" / "notes").write_text("local")
    sid = "sess-carry-05"
    first = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", WRITE], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    manifest = carry_of(cluster, sid).manifest
    cluster.etcd_put(f"carry/{sid}/chunk/{manifest.slot}/00000", b"tampered")
    second = cluster.run(b, sid, "--carry", "state", cmd=["touch", "ran"], cwd=home_b)
    assert second.wait(30) == 75
    assert "CARRY_FAILED" in second.err() and "does not match its sha256" in second.err()
    assert not (home_b / "ran").exists(), "CMD never ran on a copy it could not restore"
    assert (home_b / "state" / "notes").read_text() == "local" and len(
        list((home_b / "state").iterdir())
    ) == 1
    lease = cluster.record(sid).record.lease
    assert (lease.fence, lease.claim_status) == (2, pb.RELEASED), "the grant was released"


def test_archive_takes_the_carried_state_and_returns_its_budget(cluster: Cluster, tmp_path: Path) -> None:
    a = cluster.host("host-a")
    (home,) = homes(tmp_path, "home-a")
    (home / "state").mkdir()
    sid = "sess-carry-06"
    for _ in range(2):  # two copies: both slots hold one
        run = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", "printf x >> state/notes"], cwd=home)
        assert run.wait(30) == 0, run.err()
    assert carry_of(cluster, sid).manifest.total_bytes == 2
    cluster.stub.ArchiveSession(
        pb.ArchiveSessionRequest(session_id=sid, expected_fence=2, operator="test", reason="done"), timeout=30
    )
    assert not carry_of(cluster, sid).found

    async def left() -> tuple[list[str], bytes | None]:
        store = Store.connect(cluster.coordinator.etcd_url, prefix=cluster.coordinator.prefix)
        try:
            keys, _ = await store.list_prefix(store.key("carry", sid, ""))
            budget = await store.get(store.key("carry-budget"))
            return [k.key for k in keys], budget.value if budget else None
        finally:
            await store.close()

    keys, budget = asyncio.run(left())
    assert keys == [] and budget is not None and json.loads(budget) == {"reserved_bytes": 0}


def test_an_owner_lost_without_release_leaves_its_last_checkpoint(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    sid = "sess-carry-07"
    cmd = "printf one > state/notes; touch up; exec sleep 300"
    lost = cluster.run(a, sid, "--carry", "state", "--carry-every", "0.2", cmd=["sh", "-c", cmd], cwd=home_a)
    until("the owner's CMD running", (home_a / "up").exists)
    until("a checkpoint", lambda: carry_of(cluster, sid).manifest.reason == "checkpoint")
    # The host is lost: `run` and its CMD die together, nothing is released, nothing uploaded.
    for pid in [*descendants(lost.proc.pid), lost.proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    lost.proc.wait(10)
    # Asked not to grant over an owner that may still be uploading, the coordinator refuses, and the
    # refusal writes nothing.
    probe = pb.ProbeSessionRequest(session_id=sid)
    until("the owner proven gone", lambda: cluster.stub.ProbeSession(probe, timeout=10).verdict == "grant")
    before = snapshot(cluster.coordinator.etcd_url, cluster.coordinator.prefix)
    ask = pb.AcquireRequest(session_id=sid, host_id="host-b", operation_id="0" * 32, await_release=True)
    with pytest.raises(grpc.RpcError) as pending:
        cluster.stub.Acquire(ask, timeout=30)
    assert reason_of(pending.value) == "RELEASE_PENDING"  # type: ignore[arg-type]
    assert snapshot(cluster.coordinator.etcd_url, cluster.coordinator.prefix) == before
    (home_a / "state" / "notes").write_text("written after the checkpoint, never uploaded")
    run = cluster.run(b, sid, "--carry", "state", cmd=["sh", "-c", "cat state/notes > seen"], cwd=home_b)
    assert run.wait(60) == 0, run.err()
    # The coordinator answered RELEASE_PENDING while the owner might still be uploading; once the
    # settle time passed without a release, the last checkpoint is what arrived.
    assert "has ended; waiting up to 10s for it to upload" in run.err()
    assert "on checkpoint" in run.err() and (home_b / "seen").read_text() == "one"
    assert cluster.record(sid).record.lease.fence == 2


def test_an_unprivileged_user_carries_state_between_hosts(cluster: Cluster) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    homes_dir = unprivileged.shared_dir("holdfast-carry-nobody-")
    cluster.shared.append(homes_dir)
    home_a, home_b = homes_dir / "a", homes_dir / "b"
    for home in (home_a, home_b):
        home.mkdir(mode=0o777)
        os.chmod(home, 0o777)
    (home_a / "state").mkdir()  # nobody's: an upload carries only the running user's entries
    os.chown(home_a / "state", unprivileged.NOBODY, unprivileged.NOBODY)
    sid = "sess-carry-08"
    first = cluster.run(
        a, sid, "--carry", "state", cmd=["sh", "-c", "id -u > state/who"], cwd=home_a, as_nobody=True
    )
    assert first.wait(30) == 0, first.err()
    second = cluster.run(
        b, sid, "--carry", "state", cmd=["sh", "-c", "cat state/who > seen"], cwd=home_b, as_nobody=True
    )
    assert second.wait(30) == 0, second.err()
    uid = (home_a / "state" / "who").read_text()
    assert uid.strip() != "0" and (home_b / "seen").read_text() == uid
    assert (home_b / "state").stat().st_uid == int(uid), "restored as the user who runs `run`"


def test_a_root_named_by_its_absolute_path_is_the_copys_root(cluster: Cluster, tmp_path: Path) -> None:
    """`--carry state` on one host and `--carry /…/state` from the same directory on the next are
    one root: the copy is restored, not 'not named by this run'."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    (home_a / "state").mkdir()
    sid = "sess-carry-spelled"
    first = cluster.run(a, sid, "--carry", "state", cmd=["sh", "-c", WRITE], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    second = cluster.run(b, sid, "--carry", str(home_b / "state"), cmd=["sh", "-c", READ], cwd=home_b)
    assert second.wait(30) == 0, second.err()
    assert "restored state (2 files, 9 bytes)" in second.err()
    assert (home_b / "seen").read_text().split("\n")[0] == "v1"
    assert carry_of(cluster, sid).manifest.roots[0].path == "state", "the copy keeps its spelling"


def links_protected_here() -> bool:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    return False


@pytest.mark.skipif(not links_protected_here(),
                    reason="names outside the root are refused unless fs.protected_hardlinks is 1")
def test_a_local_git_clone_is_carried_where_hard_links_are_protected(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A local `git clone` hard-links every object to the source repository: each object had a
    name outside the root, the copy was refused CARRY_FAILED after CMD ran, and the session's work
    was not carried. Where the kernel protects hard links it is carried, and the next host's git
    reads it."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = homes(tmp_path, "home-a", "home-b")
    git = ["git", "-c", "user.name=holdfast", "-c", "user.email=holdfast@127.0.0.1"]
    subprocess.run([*git, "init", "-q", "src"], cwd=home_a, check=True)
    (home_a / "src" / "f").write_text("committed\n")
    subprocess.run([*git, "-C", "src", "add", "f"], cwd=home_a, check=True)
    subprocess.run([*git, "-C", "src", "commit", "-qm", "one"], cwd=home_a, check=True)
    subprocess.run([*git, "clone", "-q", "src", "clone"], cwd=home_a, check=True)
    objects = [p for p in (home_a / "clone" / ".git" / "objects").rglob("*") if p.is_file()]
    assert objects and all(p.stat().st_nlink == 2 for p in objects), "the clone's objects are hard links"
    sid = "sess-carry-git-clone"
    first = cluster.run(a, sid, "--carry", "clone", cmd=["true"], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    assert "carried state not uploaded" not in first.err(), first.err()
    second = cluster.run(b, sid, "--carry", "clone", cmd=["sh", "-c", "git -C clone show HEAD:f > seen"],
                         cwd=home_b)
    assert second.wait(30) == 0, second.err()
    assert (home_b / "seen").read_text() == "committed\n"
