"""A carried copy is hostile data: a session's owner, unprivileged, can upload any manifest under
its own grant, and the next owner's `run --carry` restores it as root on another host. Each copy
below aims to create a file outside the carried directory — at the root's parent, at a sibling of
the root, at a sentinel directory elsewhere. Each is refused at CommitCarry, so it is never stored;
planted straight into etcd (a copy stored before the coordinator checked it), each is refused at
restore, with nothing created anywhere (nor a setuid file or a device, which no restore makes): the
root's parent, its siblings and the sentinel stay byte-identical, and the local copy is untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from holdfast.common.carry_rules import MAX_ENTRIES
from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration import unprivileged
from tests.integration.coordinator_fixtures import Coordinator
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root"),
]
BODY = b"escaped\n"
UP = "../" * 40  # from anywhere below the carried root, far enough up to reach /


@pytest.fixture
def coordinator(etcd, tmp_path: Path, prefix: str) -> Iterator[Coordinator]:  # type: ignore[no-untyped-def]
    server = Coordinator(etcd.url, tmp_path, prefix).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sentinel() -> Iterator[Path]:
    """A directory elsewhere on the host, root-owned 0755 as /etc is, that escapes aim at."""
    path = Path(tempfile.mkdtemp(prefix="holdfast-sentinel-"))
    os.chmod(path, 0o755)
    (path / "victim-elsewhere").mkdir()
    (path / "victim-elsewhere" / "kept").write_text("kept")
    try:
        yield path
    finally:
        shutil.rmtree(path)


def link(path: str, target: str) -> tuple[str, str, str]:
    return (path, "symlink", target)


def cases(sentinel: Path) -> dict[str, list[tuple[str, ...]]]:
    """Each copy's entries below the root `notes` (the root entry is added): (path, kind[, target])."""
    victim = str(sentinel / "victim-elsewhere").lstrip("/")
    return {
        # The reviewer's: each `s` (-> .) counts one level down as text and none on disk.
        "the reviewer's chain": [
            ("d", "dir"), link("d/s", "."), link("d/l", "s/" * 24 + "../" * 25 + UP),
            ("d/l/" + victim + "/ESCAPED-by-carry", "file")],
        "a chain through . and ..": [
            ("a", "dir"), link("a/up", ".."), link("a/b", "up/a/up/../" + UP + victim),
            ("a/b/ESCAPED", "file")],
        "a link to /": [link("l", UP.rstrip("/")), ("l/" + victim + "/ESCAPED", "file")],
        "an absolute link": [link("l", "/" + victim), ("l/ESCAPED", "file")],
        "a directory replaced by a link between two entries": [
            ("d", "dir"), ("d/x", "file"), link("d", "/" + victim), ("d/ESCAPED", "file")],
        "a file under a link declared after it": [
            ("d", "dir"), ("d/l/ESCAPED", "file"), link("d/l", "../..")],
        "a link in the middle of a path": [
            ("d", "dir"), link("d/m", "../../sibling"), ("d/m/ESCAPED", "file")],
        "hard-link-like duplicates": [("f", "file"), ("f", "file")],
        "a path through ..": [("d", "dir"), ("d/../../ESCAPED", "file")],
        "an absolute path": [("/" + victim + "/ESCAPED", "file")],
        "a NUL in a name": [("ESCAPED\0/../../x", "file")],
        "a link with a NUL": [link("l", "..\0"), ("l/ESCAPED", "file")],
        "10,001 entries": [(f"f{i:05d}", "dir") for i in range(MAX_ENTRIES)],
        # Not an escape, yet never restored: what a root restore must not make.
        "a setuid file": [("tool", "file-setuid")],
        "a device file": [("null", "chardev")],
    }


def manifest_of(sid: str, entries: list[tuple[str, ...]]) -> tuple[pb.CarryManifest, bytes]:
    manifest = pb.CarryManifest(session_id=sid, fence=1, slot=0, host_id="host-a", reason="release",
                                written_at_unix_ms=1, schema_version=records.SCHEMA_VERSION)
    manifest.roots.add(path="notes", kind="dir")
    manifest.entries.add(root=0, path="", kind="dir", mode=0o755)
    stream = b""
    for path, kind, *target in entries:
        if kind.startswith("file"):
            mode = 0o4755 if kind == "file-setuid" else 0o755
            manifest.entries.add(root=0, path=path, kind="file", mode=mode, size=len(BODY),
                                 sha256=hashlib.sha256(BODY).hexdigest())
            stream += BODY
        else:
            manifest.entries.add(root=0, path=path, kind=kind, mode=0o777 if target else 0o755,
                                 link_target=target[0] if target else "")
    manifest.total_bytes = len(stream)
    if stream:
        manifest.chunk_sha256.append(hashlib.sha256(stream).hexdigest())
    return manifest, stream


def tree(*tops: Path) -> dict[str, object]:
    """Every path below `tops` with its kind, mode, owner and content or target: what must not change."""
    seen: dict[str, object] = {}
    for top in tops:
        for where, dirs, files in os.walk(top):
            for name in [*dirs, *files, ""]:
                path = os.path.join(where, name) if name else where
                st = os.lstat(path)
                body = (os.readlink(path) if stat.S_ISLNK(st.st_mode)
                        else Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else None)
                seen[path] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, body)
    return seen


def home_with_notes(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "local").write_text("the local copy")
    (home / "sibling").mkdir()
    return home


UPLOAD = """
import asyncio, json, sys
from google.protobuf import json_format
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.v1 import coordinator_pb2 as pb
import os

async def main():
    grant = Grant.from_file(os.environ["HOLDFAST_GRANT_FILE"])
    said = {}
    async with Client() as client:
        for name, (text, stream) in json.load(open(sys.argv[1])).items():
            manifest = json_format.Parse(text, pb.CarryManifest())
            stream = bytes.fromhex(stream)
            try:
                slot = await client.begin_carry(grant, len(stream), 1 if stream else 0)
                if stream:
                    await client.put_carry_chunk(grant, slot, 0, stream)
                manifest.fence, manifest.slot = grant.fence, slot
                await client.commit_carry(grant, manifest)
                said[name] = "COMMITTED"
            except ClientError as err:
                said[name] = f"{err.reason}: {err.message}"
    json.dump(said, open(sys.argv[2], "w"))

asyncio.run(main())
"""


def test_an_unprivileged_owner_cannot_commit_a_copy_that_leads_outside(
    cluster: Cluster, tmp_path: Path, sentinel: Path
) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    shared = unprivileged.shared_dir("holdfast-hostile-carry-")
    cluster.shared.append(shared)
    sid = "sess-hostile-upload"
    copies = {name: (json_format.MessageToJson(m), stream.hex())
              for name, (m, stream) in ((n, manifest_of(sid, e)) for n, e in cases(sentinel).items())}
    (shared / "copies.json").write_text(json.dumps(copies))
    (shared / "upload.py").write_text(UPLOAD)
    os.chmod(shared / "copies.json", 0o644)
    python, _ = unprivileged.interpreter()
    owner = cluster.run(a, sid, cmd=[python, str(shared / "upload.py"), str(shared / "copies.json"),
                                     str(shared / "said.json")], cwd=shared, as_nobody=True)
    assert owner.wait(60) == 0, owner.err()
    said = json.loads((shared / "said.json").read_text())
    assert set(said) == set(copies)
    wrong = {name: text for name, text in said.items()
             if not text.startswith("CARRY_TOO_LARGE" if name == "10,001 entries" else "INVALID_ARGUMENT")}
    assert wrong == {}, "every hostile copy is refused at CommitCarry"
    assert not cluster.stub.GetCarry(pb.GetCarryRequest(session_id=sid), timeout=10).found, "none was stored"
    # The next owner, root on another host, finds nothing to restore and nothing outside was made.
    home = home_with_notes(tmp_path, "home-b")
    before = tree(home, sentinel)
    run = cluster.run(b, sid, "--carry", "notes", cmd=["true"], cwd=home)
    assert run.wait(30) == 0, run.err()
    assert f"no carried state for {sid} yet" in run.err()
    assert tree(home, sentinel) == before


@pytest.mark.parametrize("case", sorted(cases(Path("/sentinel"))))
def test_a_stored_copy_that_leads_outside_is_refused_at_restore_and_writes_nothing(
    cluster: Cluster, tmp_path: Path, sentinel: Path, case: str
) -> None:
    b = cluster.host("host-b")
    sid = "sess-hostile-restore"
    manifest, stream = manifest_of(sid, cases(sentinel)[case])
    if stream:
        cluster.etcd_put(f"carry/{sid}/chunk/0/00000", stream)
    cluster.etcd_put(f"carry/{sid}/manifest", records.encode(manifest))
    home = home_with_notes(tmp_path, "home-b")
    before = tree(home, sentinel)
    run = cluster.run(b, sid, "--carry", "notes", cmd=["touch", str(home / "ran")], cwd=home)
    assert run.wait(30) == 75, run.err()
    assert "CARRY_FAILED" in run.err() and "nothing was written" in run.err(), run.err()
    assert tree(home, sentinel) == before, "nothing created, changed or removed outside (or inside)"


def test_ten_thousand_entries_are_carried_and_restored(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    (home_a / "notes").mkdir(parents=True)
    home_b.mkdir()
    make = [sys.executable, "-c", "import os\nfor i in range(9999): open(f'notes/f{i:04d}', 'w').write('x')"]
    first = cluster.run(a, "sess-carry-many", "--carry", "notes", cmd=make, cwd=home_a)
    assert first.wait(60) == 0, first.err()
    second = cluster.run(b, "sess-carry-many", "--carry", "notes", cmd=["true"], cwd=home_b)
    assert second.wait(60) == 0, second.err()
    assert "restored notes (9999 files, 9999 bytes)" in second.err()
    assert sorted(os.listdir(home_b / "notes")) == [f"f{i:04d}" for i in range(9999)]


CLAIM_HOST = """
import asyncio, hashlib, os
from holdfast.client.carry import Packed, upload
from holdfast.client.connection import Client
from holdfast.client.grant import Grant
from holdfast.v1 import coordinator_pb2 as pb

async def main():
    grant = Grant.from_file(os.environ["HOLDFAST_GRANT_FILE"])
    body = b"notes"
    manifest = pb.CarryManifest(session_id=grant.session_id, total_bytes=len(body))
    manifest.roots.add(path="notes", kind="file")
    manifest.entries.add(root=0, path="", kind="file", mode=0o644, size=len(body),
                         sha256=hashlib.sha256(body).hexdigest())
    manifest.chunk_sha256.append(hashlib.sha256(body).hexdigest())
    async with Client(host_id="forged-host") as client:  # upload() sends the client's own claim
        await upload(client, grant, Packed(manifest, [body]), "release")

asyncio.run(main())
"""


def test_a_copy_names_the_host_its_owner_was_attested_on_not_the_uploaders_claim(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b = cluster.host("host-a"), cluster.host("host-b")
    sid = "sess-carry-claimed"
    (tmp_path / "claim.py").write_text(CLAIM_HOST)
    owner = cluster.run(a, sid, cmd=[sys.executable, str(tmp_path / "claim.py")], cwd=tmp_path)
    assert owner.wait(60) == 0, owner.err()
    got = cluster.stub.GetCarry(pb.GetCarryRequest(session_id=sid), timeout=10)
    assert got.found and got.manifest.host_id == "host-a", got.manifest
    home = tmp_path / "home-b"
    home.mkdir()
    run = cluster.run(b, sid, "--carry", "notes", cmd=["true"], cwd=home)
    assert run.wait(30) == 0, run.err()
    assert "from host host-a on release" in run.err() and "forged-host" not in run.err(), run.err()


SECRET = b"ROOT-SECRET\n"
NOTES = b"root's notes\n"
NOBODY = unprivileged.NOBODY
# What another user does to a root `run`'s carried root, or the path above it, while its CMD runs:
# put a link to root's own directory in the place of the directory holding the root, or rename
# there one of root's directories kept beside it (a rename within one directory needs no write on
# the one moved), or rename one of root's kept beside the root to the root's own name.
SWAPS = {
    "a link": "mv {base}/sub {base}/sub.old && ln -s {vault} {base}/sub",
    "another directory": "mv {base}/sub {base}/sub.old && mv {base}/vault {base}/sub",
    "another root": "mv {base}/sub/data {base}/sub/data.old && mv {base}/sub/vault {base}/sub/data",
}
REFUSED = {
    "a link": "is a link of uid 65534, neither yours nor root's: not followed",
    "another directory": "its directory is not the one it was when the run started",
    "another root": ("it is not the file or directory it was when the run started, and another user may "
                     "change"),
}


def nobodys_tree(cluster: Cluster, tmp_path: Path) -> tuple[Path, Path]:
    """`base/sub/data/a.txt`, `base` and `sub` nobody's, root's `data` (an upload carries only the
    running user's entries); and root's 0700 `vault/data/a.txt` holding the secret, beside `sub` in
    `base` and in a root-only directory elsewhere, and `vault/a.txt` beside `data` in `sub`: (base,
    the elsewhere vault)."""
    base = unprivileged.shared_dir("holdfast-carry-swap-")
    cluster.shared.append(base)
    (base / "sub" / "data").mkdir(parents=True)
    (base / "sub" / "data" / "a.txt").write_bytes(NOTES)
    for path in (base, base / "sub"):
        os.chown(path, NOBODY, NOBODY)
    os.chmod(base, 0o755)
    elsewhere = tmp_path / "root-only"
    for vault, below in ((base / "vault", "data"), (elsewhere, "data"), (base / "sub" / "vault", "")):
        (vault / below).mkdir(parents=True)
        (vault / below / "a.txt").write_bytes(SECRET)
        os.chmod(vault, 0o700)
    return base, elsewhere


def swap_as_nobody(swap: str, base: Path, elsewhere: Path) -> None:
    vault = elsewhere if swap == "a link" else base / "vault"
    subprocess.run([*unprivileged.DROP, "sh", "-c", SWAPS[swap].format(base=base, vault=vault)], check=True)


def shas(cluster: Cluster, sid: str) -> list[str]:
    got = cluster.stub.GetCarry(pb.GetCarryRequest(session_id=sid), timeout=10)
    return [e.sha256 for e in got.manifest.entries if e.kind == "file"] if got.found else []


def waiting_cmd(tmp_path: Path) -> tuple[list[str], Path, Path]:
    """CMD that says it runs (`up`), then waits until the test writes its FIFO."""
    up, go = tmp_path / "up", tmp_path / "go"
    os.mkfifo(go)
    return ["sh", "-c", f"touch {up}; read line < {go}"], up, go


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_a_root_run_does_not_upload_what_another_user_put_above_its_root(
    cluster: Cluster, tmp_path: Path, swap: str
) -> None:
    """Root carries its `base/sub/data` in nobody's `sub`; while CMD runs nobody puts root's own
    directory where `sub` or `data` was. Packing followed the path: `run` said 'carried … (12
    bytes)', root's secret, which nobody then restored with a run of their own. The root is
    refused, nothing uploaded."""
    a = cluster.host("host-a")
    base, elsewhere = nobodys_tree(cluster, tmp_path)
    cmd, up, go = waiting_cmd(tmp_path)
    sid = "sess-carry-swapped-above"
    run = cluster.run(a, sid, "--carry", str(base / "sub" / "data"), cmd=cmd, cwd=tmp_path)
    until("CMD running", up.exists)
    swap_as_nobody(swap, base, elsewhere)
    go.write_text("go\n")
    assert run.wait(30) == 0, run.err()
    assert "carried state not uploaded (CARRY_FAILED)" in run.err(), run.err()
    assert REFUSED[swap] in run.err(), run.err()
    assert shas(cluster, sid) == [], "nothing was uploaded"


def test_a_checkpoint_does_not_upload_what_another_user_put_above_its_root(
    cluster: Cluster, tmp_path: Path
) -> None:
    """--carry-every packs as the end does: a checkpoint after nobody's swap is refused, and the
    session keeps the checkpoint taken before it."""
    a = cluster.host("host-a")
    base, elsewhere = nobodys_tree(cluster, tmp_path)
    cmd, up, go = waiting_cmd(tmp_path)
    sid = "sess-carry-swapped-checkpoint"
    run = cluster.run(a, sid, "--carry", str(base / "sub" / "data"), "--carry-every", "0.2", cmd=cmd,
                      cwd=tmp_path)
    until("CMD running", up.exists)
    notes, secret = hashlib.sha256(NOTES).hexdigest(), hashlib.sha256(SECRET).hexdigest()
    until("a checkpoint of root's notes", lambda: shas(cluster, sid) == [notes])
    swap_as_nobody("a link", base, elsewhere)
    until("a checkpoint after the swap",
          lambda: "carried state not uploaded" in run.err() or secret in shas(cluster, sid))
    assert shas(cluster, sid) == [notes], "the checkpoint before the swap stands"
    assert "carried state not uploaded (CARRY_FAILED)" in run.err(), run.err()
    assert REFUSED["a link"] in run.err(), run.err()
    go.write_text("go\n")
    assert run.wait(30) == 0, run.err()
    assert shas(cluster, sid) == [notes], "nor did the end upload root's secret"


# What another user does at a root's name while a root `run`'s CMD runs, in a directory of their
# own (nobody's, 0755: they may rename what is in it) or a sticky one (1777: they may only create
# names there): the root absent when CMD started, or deleted by CMD. Root makes the hard link,
# standing in for nobody where fs.protected_hardlinks is 0: where it is 1, nobody may not link a
# file of root's they cannot read, and names outside the root are carried. Not changed host-wide
# here: `run` reads 0 in a mount namespace of its own (UNPROTECTED_LINKS).
AS_NOBODY, AS_ROOT = unprivileged.DROP, []
UNPROTECTED_LINKS = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     'printf "0\\n" > "$0" && mount --bind "$0" /proc/sys/fs/protected_hardlinks && '
                     'exec "$@"']


def unprotected_links(tmp_path: Path) -> list[str]:
    """A wrap for Cluster.run: `run` reads fs.protected_hardlinks 0, from a file in `tmp_path`."""
    return [*UNPROTECTED_LINKS, str(tmp_path / "protected_hardlinks")]

AT_THE_NAME = {
    "root's secret renamed to it in nobody's directory": (
        0o755, "", AS_NOBODY, "mv {base}/secret.key {base}/out.txt",
        "out.txt: it did not exist when the run started, and another user may change the directory "
        "holding it"),
    "nobody's file made at it in a sticky directory": (
        0o1777, "", AS_NOBODY, "printf 'nobody' > {base}/out.txt",
        "out.txt: it did not exist when the run started, and uid 65534 owns it"),
    "nobody's file made at it once CMD deleted it": (
        0o1777, "rm out.txt; ", AS_NOBODY, "printf 'nobody' > {base}/out.txt",
        "out.txt: it is not the file or directory it was when the run started, and uid 65534 owns it"),
    "a hard link to root's secret made at it in a sticky directory": (
        0o1777, "", AS_ROOT, "ln {base}/secret.key {base}/out.txt",
        "out.txt: it has 2 names (hard-linked), 1 outside the carried root, and hard links are not "
        "protected on this host"),
}


@pytest.mark.parametrize("case", sorted(AT_THE_NAME))
def test_a_root_run_does_not_upload_what_another_user_put_at_its_roots_name(
    cluster: Cluster, tmp_path: Path, case: str
) -> None:
    """A root absent when CMD started (or deleted by CMD) took whatever stood at its name at the
    end: nobody renamed root's 0600 secret there, or hard-linked it there, and `run` said 'carried
    out.txt (12 bytes)', for nobody to restore; or nobody's own file was carried as root's. Each is
    refused CARRY_FAILED, naming the root and why, and nothing is stored."""
    mode, cmd_first, who, act, why = AT_THE_NAME[case]
    a = cluster.host("host-a")
    base = unprivileged.shared_dir("holdfast-carry-name-")
    cluster.shared.append(base)
    (base / "secret.key").write_bytes(SECRET)
    os.chmod(base / "secret.key", 0o600)
    if cmd_first:
        (base / "out.txt").write_text("root's own")
    if mode == 0o755:
        os.chown(base, NOBODY, NOBODY)
    os.chmod(base, mode)
    up, go = tmp_path / "up", tmp_path / "go"
    os.mkfifo(go)
    sid = "sess-carry-at-the-name"
    cmd = ["sh", "-c", f"{cmd_first}touch {up}; read line < {go}"]
    wrap = unprotected_links(tmp_path) if who is AS_ROOT else []  # root's link stands in for nobody's
    run = cluster.run(a, sid, "--carry", "out.txt", cmd=cmd, cwd=base, wrap=wrap)
    until("CMD running", up.exists)
    subprocess.run([*who, "sh", "-c", act.format(base=base)], check=True)
    go.write_text("go\n")
    assert run.wait(30) == 0, run.err()
    assert "carried state not uploaded (CARRY_FAILED)" in run.err(), run.err()
    assert why in run.err(), run.err()
    assert shas(cluster, sid) == [], "nothing was uploaded"


# Inside root's directory root `out` (in root's 0755 base): a directory of nobody's, or one of
# root's that others may write (sticky or not), where nobody writes while CMD runs.
IN_THE_ROOT = {
    "nobody's directory": (0o755, NOBODY, "out/drop: uid 65534 owns it, not uid 0 that runs this"),
    "root's sticky directory others may write": (0o1777, 0, "out/drop: another user may make names in it"),
}


@pytest.mark.parametrize("case", sorted(IN_THE_ROOT))
def test_a_root_run_does_not_upload_what_another_user_put_in_its_root(
    cluster: Cluster, tmp_path: Path, case: str
) -> None:
    """Root carries `out`, its own, which holds `drop/`; while CMD runs nobody writes `drop/config`.
    Packing judged no entry below the root: `run` carried nobody's file, and the next host restored
    it as root's (uid 0, 0644). The copy is refused CARRY_FAILED naming the entry, nothing stored."""
    mode, owner, why = IN_THE_ROOT[case]
    a = cluster.host("host-a")
    base = unprivileged.shared_dir("holdfast-carry-inside-")
    cluster.shared.append(base)
    os.chmod(base, 0o755)
    (base / "out" / "drop").mkdir(parents=True)
    (base / "out" / "state").write_text("root's own")
    os.chown(base / "out" / "drop", owner, owner)
    os.chmod(base / "out" / "drop", mode)
    cmd, up, go = waiting_cmd(tmp_path)
    sid = "sess-carry-inside"
    run = cluster.run(a, sid, "--carry", "out", cmd=cmd, cwd=base)
    until("CMD running", up.exists)
    subprocess.run([*unprivileged.DROP, "sh", "-c", f"printf nobody-planted > {base}/out/drop/config"],
                   check=True)
    go.write_text("go\n")
    assert run.wait(30) == 0, run.err()
    assert "carried state not uploaded (CARRY_FAILED)" in run.err(), run.err()
    assert why in run.err(), run.err()
    assert shas(cluster, sid) == [], "nothing was uploaded"


def test_a_hard_link_planted_while_a_directory_was_open_is_refused_once_it_is_closed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Root's `out/drop` is 0777; a hard link to root's 0600 secret, outside `out`, is made in it
    (root stands in for nobody where fs.protected_hardlinks is 0, as `run` reads it here). The run is
    refused; root closes `drop` as the refusal advises, and the next run carried the link:
    TOPSECRET, for nobody to restore. A file with a name outside the root is refused whatever the
    modes now."""
    a = cluster.host("host-a")
    base = unprivileged.shared_dir("holdfast-carry-planted-")
    cluster.shared.append(base)
    os.chmod(base, 0o755)
    (base / "out" / "drop").mkdir(parents=True)
    os.chmod(base / "out" / "drop", 0o777)
    (base / "secret").write_bytes(b"TOPSECRET\n")
    os.chmod(base / "secret", 0o600)
    os.link(base / "secret", base / "out" / "drop" / "loot")
    sid = "sess-carry-planted-link"
    open_run = cluster.run(a, sid, "--carry", "out", cmd=["true"], cwd=base)
    assert open_run.wait(30) == 0, open_run.err()
    assert "carried state not uploaded (CARRY_FAILED)" in open_run.err(), open_run.err()
    assert "out/drop: another user may make names in it" in open_run.err(), open_run.err()
    assert "(`chmod go-w out/drop` closes that)" in open_run.err(), open_run.err()
    os.chmod(base / "out" / "drop", 0o755)
    closed = cluster.run(a, sid, "--carry", "out", cmd=["true"], cwd=base, wrap=unprotected_links(tmp_path))
    assert closed.wait(30) == 0, closed.err()
    assert "carried state not uploaded (CARRY_FAILED)" in closed.err(), closed.err()
    why = "out/drop/loot: it has 2 names (hard-linked), 1 outside the carried root"
    assert why in closed.err(), closed.err()
    assert shas(cluster, sid) == [], "nothing was uploaded"


def test_a_run_not_as_root_carries_a_root_owned_file_in_its_tree_and_refuses_one_it_cannot_read(
    cluster: Cluster,
) -> None:
    """Nobody's ~/.codex holds a root-owned 0644 file a sudo left: refused as 'uid 0 owns it', with
    advice to carry as the owner — as root, who would then refuse nobody's files. Root is trusted
    and the file is read as nobody: carried, and restored on the next host. Made 0600, nobody
    cannot read it: CARRY_FAILED naming it, nothing uploaded."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    homes = unprivileged.shared_dir("holdfast-carry-sudo-left-")
    cluster.shared.append(homes)
    home_a, home_b = homes / "a", homes / "b"
    (home_a / ".codex").mkdir(parents=True)
    home_b.mkdir()
    (home_a / ".codex" / "config.toml").write_text("nobody's\n")
    (home_a / ".codex" / "by-sudo.json").write_text("root's\n")
    os.chmod(home_a / ".codex" / "by-sudo.json", 0o644)
    for path in (home_a, home_a / ".codex", home_a / ".codex" / "config.toml", home_b):
        os.chown(path, NOBODY, NOBODY)
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chmod(home_a / ".codex" / "by-sudo.json", 0o600)
    unreadable = cluster.run(a, "sess-carry-sudo-unreadable", "--carry", ".codex", cmd=["true"], cwd=home_a,
                             as_nobody=True)
    assert unreadable.wait(30) == 0, unreadable.err()
    assert "carried state not uploaded (CARRY_FAILED)" in unreadable.err(), unreadable.err()
    assert ".codex/by-sudo.json: Permission denied" in unreadable.err(), unreadable.err()
    assert "Traceback" not in unreadable.err(), unreadable.err()
    assert shas(cluster, "sess-carry-sudo-unreadable") == [], "nothing was uploaded"
    os.chmod(home_a / ".codex" / "by-sudo.json", 0o644)
    sid = "sess-carry-sudo-left"
    first = cluster.run(a, sid, "--carry", ".codex", cmd=["true"], cwd=home_a, as_nobody=True)
    assert first.wait(30) == 0, first.err()
    assert "CARRY_FAILED" not in first.err(), first.err()
    assert len(shas(cluster, sid)) == 2, first.err()
    second = cluster.run(b, sid, "--carry", ".codex", cmd=["true"], cwd=home_b, as_nobody=True)
    assert second.wait(30) == 0, second.err()
    assert (home_b / ".codex" / "by-sudo.json").read_text() == "root's\n"
    assert (home_b / ".codex" / "config.toml").read_text() == "nobody's\n"


def test_cmd_replacing_its_roots_directory_by_a_rename_in_a_root_only_place_is_carried(
    cluster: Cluster, tmp_path: Path
) -> None:
    """CMD writes a new `out` beside the old and renames it into place: the root's directory is
    another than at the start, where no other user may change anything. That is CMD's own work:
    carried, and the next host restores the new content (refused before, the stale copy kept)."""
    a, b = cluster.host("host-a"), cluster.host("host-b")
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    (home_a / "out").mkdir(parents=True)
    home_b.mkdir()
    (home_a / "out" / "state.json").write_text("v2\n")
    sid = "sess-carry-cmd-renamed-dir"
    rewrite = "mkdir out.new && echo v3 > out.new/state.json && rm -rf out && mv out.new out"
    first = cluster.run(a, sid, "--carry", "out/state.json", cmd=["sh", "-c", rewrite], cwd=home_a)
    assert first.wait(30) == 0, first.err()
    assert "CARRY_FAILED" not in first.err(), first.err()
    second = cluster.run(b, sid, "--carry", "out/state.json", cmd=["true"], cwd=home_b)
    assert second.wait(30) == 0, second.err()
    assert (home_b / "out" / "state.json").read_text() == "v3\n"
