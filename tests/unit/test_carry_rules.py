"""The carry rules refuse every entry a restore must not write; pack and restore round-trip a real
directory (local files only, no coordinator) and refuse a file that changes while it is read."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from holdfast.client import carry, carry_restore
from holdfast.client.carry_restore import restore
from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.common.carry_rules import (
    CHUNK_BYTES,
    MAX_ENTRIES,
    CarryRefused,
    Identity,
    Place,
    check_cap,
    check_entry,
    check_manifest,
    check_tree,
    chunked,
    describe,
    hardlinks_protected,
    linked_outside_because,
    moved_because,
    names_open_because,
    not_carried_because,
    root_name,
)
from holdfast.common.reasons import Reason
from holdfast.coordinator import carry as coordinator_carry
from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb


@pytest.mark.parametrize("path", ["a", "d/e/f.txt", ""])
def test_relative_entries_and_the_root_are_accepted(path: str) -> None:
    check_entry(path, "dir" if not path else "file", 0o644)


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "./x", "a//b"])
def test_escaping_or_unnormalised_paths_are_refused(path: str) -> None:
    with pytest.raises(CarryRefused):
        check_entry(path, "file", 0o644)


@pytest.mark.parametrize(
    "kind,mode", [("file", 0o4755), ("file", 0o2755), ("dir", 0o1777), ("chardev", 0o600), ("fifo", 0o600)]
)
def test_special_bits_and_kinds_are_refused(kind: str, mode: int) -> None:
    with pytest.raises(CarryRefused):
        check_entry("x", kind, mode)


def test_a_link_target_is_relative_and_holds_no_nul() -> None:
    check_entry("d/link", "symlink", 0o777, "../a")
    for target in ("/etc/passwd", "/", "", "a\0b"):
        with pytest.raises(CarryRefused):
            check_entry("d/link", "symlink", 0o777, target)
    with pytest.raises(CarryRefused):
        check_entry("", "symlink", 0o777, "a")  # a root is a file or a directory
    with pytest.raises(CarryRefused):
        check_entry("f", "file", 0o644, "a")  # only a link has a target


ESCAPE = "s/" * 24 + "../" * 25  # the reviewer's chain: each `s` (-> .) buys one more `..`
TREES_REFUSED = {
    "the reviewer's chain through s -> .": [("d", "dir"), ("d/s", "symlink", "."),
                                            ("d/l", "symlink", ESCAPE)],
    "a file beneath that chain": [("d", "dir"), ("d/s", "symlink", "."), ("d/l", "symlink", "s/.."),
                                  ("d/l/x", "file")],
    "a chain of links through . and ..": [("a", "dir"), ("a/up", "symlink", ".."),
                                          ("a/b", "symlink", "up/a/up/..")],
    "a link to the root's parent": [("l", "symlink", "..")],
    "a link to / written relatively": [("d", "dir"), ("d/l", "symlink", "../" * 64)],
    "a file under a link declared after it": [("d", "dir"), ("d/l/x", "file"), ("d/l", "symlink", "..")],
    "a file under a link declared before it": [("l", "symlink", "d"), ("d", "dir"), ("l/x", "file")],
    "a link in the middle of a path": [("d", "dir"), ("d/m", "symlink", "."), ("d/m/e", "dir")],
    "a directory replaced by a link": [("d", "dir"), ("d", "symlink", ".")],
    "a path named twice": [("f", "file"), ("f", "file")],
    "an entry whose parent is a file": [("f", "file"), ("f/g", "file")],
    "an entry whose parent is never declared": [("a/b", "file")],
    "a child before its parent": [("a/b", "file"), ("a", "dir")],
    "a loop": [("a", "symlink", "b"), ("b", "symlink", "a")],
    "a self loop": [("a", "symlink", "a/x")],
    "a name with NUL": [("a\0b", "file")],
    "a name with an empty segment": [("a", "dir"), ("a//b", "file")],
    "a trailing slash": [("a", "dir"), ("a/", "file")],
    "a dot segment": [("a", "dir"), ("a/./b", "file")],
    "a long name": [("x" * 256, "file")],
}
TREES_ACCEPTED = {
    "a link to a sibling": [("d", "dir"), ("d/f", "file"), ("d/l", "symlink", "f")],
    "a link up and back in": [("d", "dir"), ("e", "dir"), ("d/l", "symlink", "../e")],
    "a chain that stays": [("d", "dir"), ("d/s", "symlink", "."), ("d/l", "symlink", "s/s/s/..")],
    "a link to the root": [("d", "dir"), ("d/top", "symlink", "..")],
    "a dangling link below": [("l", "symlink", "missing/deeper/..")],
}


def tree(spec: list[tuple[str, ...]]) -> list[tuple[str, str, int, str]]:
    out = [("", "dir", 0o755, "")]
    for path, kind, *target in spec:
        out.append((path, kind, 0o777 if kind == "symlink" else 0o644, target[0] if target else ""))
    return out


@pytest.mark.parametrize("name", sorted(TREES_REFUSED))
def test_trees_that_would_reach_outside_or_are_malformed_are_refused(name: str) -> None:
    with pytest.raises(CarryRefused):
        check_tree(tree(TREES_REFUSED[name]), "dir")


@pytest.mark.parametrize("name", sorted(TREES_ACCEPTED))
def test_trees_that_stay_inside_are_accepted(name: str) -> None:
    check_tree(tree(TREES_ACCEPTED[name]), "dir")


def test_a_manifest_is_judged_whole() -> None:
    def manifest(roots: list[tuple[str, str]], entries: list[tuple[int, str, str]]) -> pb.CarryManifest:
        m = pb.CarryManifest(session_id="sess-unit-m")
        for path, kind in roots:
            m.roots.add(path=path, kind=kind)
        for root, path, kind in entries:
            m.entries.add(root=root, path=path, kind=kind, mode=0o644,
                          sha256="0" * 64 if kind == "file" else "")
        return m

    check_manifest(manifest([("a", "dir"), ("/abs/b", "file")], [(0, "", "dir"), (1, "", "file")]))
    for bad in (
        manifest([("a", "dir"), ("a/b", "dir")], [(0, "", "dir"), (1, "", "dir")]),   # overlapping roots
        manifest([("a", "dir"), ("a", "dir")], [(0, "", "dir"), (1, "", "dir")]),     # one root twice
        manifest([("a/../b", "dir")], [(0, "", "dir")]),                                # not normalised
        manifest([("a", "dir")], [(0, "", "dir"), (1, "x", "file")]),                   # no such root
        manifest([("a", "dir")], [(0, "x", "file")]),                                   # no root entry
        manifest([("a", "file")], [(0, "", "file"), (0, "x", "file")]),                 # a file is one entry
        manifest([("a", "dir")], [(0, "", "dir"), (0, "x", "fifo")]),
    ):
        with pytest.raises(CarryRefused):
            check_manifest(bad)
    too_many = manifest([("a", "dir")], [(0, "", "dir")] + [(0, f"f{i}", "dir") for i in range(MAX_ENTRIES)])
    with pytest.raises(CarryRefused, match="10001 entries"):
        check_manifest(too_many)
    del too_many.entries[-1]
    check_manifest(too_many)


def test_root_names_and_the_cap() -> None:
    assert root_name("state/") == "state" and root_name("/abs/x/../y") == "/abs/y"
    for bad in (".", "/", "..", "../up"):
        with pytest.raises(CarryRefused):
            root_name(bad)
    check_cap(10, 10)
    with pytest.raises(CarryRefused, match="over the coordinator's per-session cap of 10 bytes"):
        check_cap(11, 10)
    assert [len(c) for c in chunked(b"x" * (CHUNK_BYTES + 1))] == [CHUNK_BYTES, 1] and chunked(b"") == []


def test_pack_and_restore_round_trip(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "state" / "sub").mkdir(parents=True)
    (src / "state" / "a").write_bytes(os.urandom(CHUNK_BYTES + 10))
    (src / "state" / "sub" / "b").write_text("bee")
    os.chmod(src / "state" / "sub" / "b", 0o4640)  # the setuid bit is not carried
    os.symlink("sub/b", src / "state" / "link")
    os.symlink("/etc/passwd", src / "state" / "outside")
    os.mkfifo(src / "state" / "pipe")
    (src / "notes.txt").write_text("n")
    packed = carry.pack(["state", "notes.txt"], str(src), "sess-unit-1")
    assert len(packed.chunks) == 2 and packed.manifest.total_bytes == CHUNK_BYTES + 14
    assert sorted(s.split(":")[0] for s in packed.skipped) == ["state/outside", "state/pipe"]
    packed.manifest.written_at_unix_ms = 1
    dst.mkdir()
    (dst / "state").mkdir()
    (dst / "state" / "stale").write_text("replaced")
    said = restore(packed.manifest, b"".join(packed.chunks), ["state", "notes.txt"], str(dst))
    assert said[0].startswith("restored state (2 files,") and said[1].startswith(
        "restored notes.txt (1 files"
    )
    assert (dst / "state" / "a").read_bytes() == (src / "state" / "a").read_bytes()
    assert (dst / "state" / "sub" / "b").stat().st_mode & 0o7777 == 0o640
    assert os.readlink(dst / "state" / "link") == "sub/b" and not (dst / "state" / "stale").exists()
    assert (dst / "notes.txt").read_text() == "n"
    assert sorted(p.name for p in dst.iterdir()) == ["notes.txt", "state"], "nothing temporary left"
    # A root the run does not name is said, not written.
    (dst / "notes.txt").unlink()
    said = restore(packed.manifest, b"".join(packed.chunks), ["state"], str(dst))
    assert said[0] == "carried notes.txt not restored: this run does not name it with --carry"
    assert not (dst / "notes.txt").exists()


def test_a_file_changing_while_it_is_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "log").write_text("one")
    real_read = carry.os.fdopen

    def read_then_append(fd: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        handle = real_read(fd, *args, **kwargs)  # type: ignore[call-overload]
        with open(tmp_path / "state" / "log", "a") as log:  # the writer, between open and read's end
            log.write("two")
        return handle

    monkeypatch.setattr(carry.os, "fdopen", read_then_append)
    with pytest.raises(ClientError, match="state/log changed while it was read"):
        carry.pack(["state"], str(tmp_path), "sess-unit-2")


def test_one_bad_root_means_no_root_is_put_in_place(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "first").mkdir(parents=True)
    (src / "first" / "a").write_text("carried")
    (src / "second").write_text("carried too")
    packed = carry.pack(["first", "second"], str(src), "sess-unit-3")
    packed.manifest.entries[-1].sha256 = "0" * 64  # the second root's file is corrupt
    (dst / "first").mkdir(parents=True)
    (dst / "first" / "a").write_text("local")
    with pytest.raises(ClientError, match=r"restoring second: .* does not match its sha256"):
        restore(packed.manifest, b"".join(packed.chunks), ["first", "second"], str(dst))
    assert (dst / "first" / "a").read_text() == "local", "the good first root was not put in place either"
    assert sorted(p.name for p in dst.iterdir()) == ["first"], "nothing temporary left"


def test_a_hop_bomb_is_judged_in_time_linear_in_its_size() -> None:
    """Hundreds of links each through 39 hops of one 4,000-byte link: well within a manifest's
    size, and judged by the coordinator in its event loop, so it must not cost minutes."""
    net_zero = "/".join(["a"] * 800 + [".."] * 800)  # 800 down, 800 up: back where it started
    spec: list[tuple[str, ...]] = [("z", "symlink", net_zero)]
    spec += [(f"b{i}", "symlink", "/".join(["z"] * 39)) for i in range(300)]
    started = time.monotonic()
    check_tree(tree(spec), "dir")
    assert time.monotonic() - started < 2


def test_a_chain_of_links_is_judged_without_recursing_per_link() -> None:
    chain: list[tuple[str, ...]] = [(f"l{i}", "symlink", f"l{i + 1}") for i in range(MAX_ENTRIES - 2)]
    with pytest.raises(CarryRefused, match="more than 40 links"):
        check_tree(tree([*chain, (f"l{MAX_ENTRIES - 2}", "symlink", ".")]), "dir")
    check_tree(tree([*chain[-39:], (f"l{MAX_ENTRIES - 2}", "symlink", ".")]), "dir")  # 40 hops


DEEP = 1_100  # deeper than Python's recursion limit; the manifest still within the coordinator's


def deep_copy(depth: int, file_sha256: str) -> pb.CarryManifest:
    """A valid copy `depth` directories deep (each 'd', well within PATH_MAX), then one file."""
    m = pb.CarryManifest(session_id="sess-unit-deep", written_at_unix_ms=1, total_bytes=1)
    m.roots.add(path="notes", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    for level in range(1, depth + 1):
        m.entries.add(root=0, path="/".join(["d"] * level), kind="dir", mode=0o755)
    m.entries.add(root=0, path="f", kind="file", mode=0o644, size=1, sha256=file_sha256)
    return m


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, emptied after the test: pytest's own clean-up of old temporary directories
    recurses, and a tree 1,100 levels deep left there would fail every later pytest session."""
    yield tmp_path
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            files.remove_tree(fd, name)
    finally:
        os.close(fd)


def test_a_deep_copy_that_fails_is_removed_and_said(deep_tmp: Path) -> None:
    """1,100 levels outrun Python's recursion limit: a recursive removal raised RecursionError,
    left the temporary tree behind and said nothing true."""
    assert len(records.encode(deep_copy(DEEP, "0" * 64))) < coordinator_carry.MANIFEST_LIMIT  # a valid copy
    (deep_tmp / "notes").mkdir()
    with pytest.raises(ClientError, match=r"does not match its sha256.*nothing of the carried state"):
        restore(deep_copy(DEEP, "0" * 64), b"x", ["notes"], str(deep_tmp))
    assert sorted(p.name for p in deep_tmp.iterdir()) == ["notes"], "nothing temporary left"


def test_a_deep_copy_restores_over_a_deep_local_tree(deep_tmp: Path) -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    (deep_tmp / "notes").mkdir()
    restore(deep_copy(DEEP, sha), b"x", ["notes"], str(deep_tmp))
    said = restore(deep_copy(DEEP, sha), b"x", ["notes"], str(deep_tmp))  # the old deep tree removed
    assert said[0].startswith("restored notes (1 files, 1 bytes)")
    assert sorted(p.name for p in deep_tmp.iterdir()) == ["notes"], "no old copy left beside it"


def as_nobody(work: Callable[[], None]) -> None:
    """`work` in a child running as uid 65534, as an unprivileged restorer would; fails if it raises."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            work()
        except BaseException:  # any failure is the child's exit status
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_unprivileged_restore_over_read_only_directories_leaves_no_old_copy() -> None:
    """A carried 0o555 directory (a module cache) and a 0o000 one: the next restore by the same
    unprivileged user removed neither, and kept the whole old copy beside the root, unsaid."""
    box = Path(tempfile.mkdtemp(prefix="holdfast-carry-ro-"))  # /tmp, which nobody may traverse
    box.chmod(0o755)
    src, dst = box / "src", box / "dst"
    for top in (src, dst):
        top.mkdir()
        os.chown(top, 65534, 65534)

    def carry_and_restore_twice() -> None:
        (src / "notes" / "cache" / "mod").mkdir(parents=True)
        (src / "notes" / "cache" / "mod" / "a.go").write_text("package a")
        (src / "notes" / "sealed").mkdir()
        (src / "notes" / "sealed" / "x").write_text("x")
        os.chmod(src / "notes" / "cache" / "mod", 0o555)
        os.chmod(src / "notes" / "sealed", 0o000)
        os.chmod(src / "notes" / "cache", 0o555)
        packed = carry.pack(["notes"], str(src), "sess-unit-ro")
        packed.manifest.written_at_unix_ms = 1
        for _ in range(2):
            restore(packed.manifest, b"".join(packed.chunks), ["notes"], str(dst))
            assert sorted(p.name for p in dst.iterdir()) == ["notes"], "no old copy left beside it"

    try:
        as_nobody(carry_and_restore_twice)
    finally:
        shutil.rmtree(box)  # as root, whatever the modes


def test_a_deep_local_tree_is_measured_and_packed(deep_tmp: Path) -> None:
    """os.walk recurses once per level: a restored copy 1,100 levels deep (a valid one) made every
    later measure and pack of it raise RecursionError, so its owner could never upload again."""
    restore(deep_copy(DEEP, hashlib.sha256(b"x").hexdigest()), b"x", ["notes"], str(deep_tmp))
    assert carry.measure(["notes"], str(deep_tmp), "sess-unit-deep", "")[0] == {"notes": 1}
    assert len(carry.pack(["notes"], str(deep_tmp), "sess-unit-deep").manifest.entries) == DEEP + 2


def test_a_link_whose_target_is_not_utf8_is_left_out_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "kept").write_text("k")
    os.symlink(b"caf\xe9", bytes(tmp_path / "notes" / "latin1"))
    packed = carry.pack(["notes"], str(tmp_path), "sess-unit-enc")
    assert [e.path for e in packed.manifest.entries] == ["", "kept"]
    assert packed.skipped == ["notes/latin1: its link's target is not UTF-8; not carried"]


def test_a_file_gone_before_it_is_read_fails_the_copy_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint while CMD runs meets files CMD removes: an OSError escaped pack, which the
    owner does not catch (only ClientError), ending its checkpoints or its release."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "scratch").write_text("s")
    real_listed = carry._listed

    def list_then_remove(directory: int) -> carry.Listed:
        found = real_listed(directory)
        (tmp_path / "notes" / "scratch").unlink()  # CMD, between the listing and the read
        return found

    monkeypatch.setattr(carry, "_listed", list_then_remove)
    with pytest.raises(ClientError, match=r"notes/scratch: No such file or directory; nothing of this copy"):
        carry.pack(["notes"], str(tmp_path), "sess-unit-gone")


def test_an_unreadable_directory_is_said_not_silently_emptied() -> None:
    box = Path(tempfile.mkdtemp(prefix="holdfast-carry-unread-"))
    box.chmod(0o755)
    os.chown(box, 65534, 65534)

    def pack_it() -> None:
        (box / "notes" / "sealed").mkdir(parents=True)
        (box / "notes" / "sealed" / "x").write_text("x")
        os.chmod(box / "notes" / "sealed", 0o000)
        packed = carry.pack(["notes"], str(box), "sess-unit-unread")
        assert [s.split(":")[0] for s in packed.skipped] == ["notes/sealed"], packed.skipped

    try:
        as_nobody(pack_it)
    finally:
        shutil.rmtree(box)


def test_a_copy_whose_manifest_the_coordinator_would_refuse_is_not_uploaded(tmp_path: Path) -> None:
    """6,000 empty files with 200-byte names: under MAX_ENTRIES, but a manifest over the etcd
    request the coordinator's CommitCarry allows, so pack passed it, every chunk was uploaded,
    and the commit refused it at the end of every run."""
    for count, length, fits in ((6_000, 200, False), (5_000, 150, True)):
        root = tmp_path / f"notes{count}"
        root.mkdir()
        for i in range(count):
            (root / f"{i:0{length}d}").touch()
        if fits:
            packed = carry.pack([root.name], str(tmp_path), "sess-unit-size")
            packed.manifest.fence, packed.manifest.slot, packed.manifest.reason = 2**62, 1, "checkpoint"
            packed.manifest.host_id = "h" * 63
            assert len(records.encode(packed.manifest)) <= coordinator_carry.MANIFEST_LIMIT
        else:
            with pytest.raises(ClientError, match="nothing was uploaded") as refused:
                carry.pack([root.name], str(tmp_path), "sess-unit-size")
            assert refused.value.reason == Reason.CARRY_TOO_LARGE


def test_a_root_with_a_long_name_restores(tmp_path: Path) -> None:
    """A root named with 250 bytes (NAME_MAX is 255) packs; its restore made '.<name>.holdfast-
    restore-<hex>' beside it, a name over NAME_MAX, so every restore of it failed."""
    name = "é" * 125
    (tmp_path / "src" / name).mkdir(parents=True)
    (tmp_path / "src" / name / "a").write_text("a")
    packed = carry.pack([name], str(tmp_path / "src"), "sess-unit-long")
    (tmp_path / "dst" / name).mkdir(parents=True)
    (tmp_path / "dst" / name / "old").write_text("o")  # replaced, through the old copy's holder
    restore(packed.manifest, b"".join(packed.chunks), [name], str(tmp_path / "dst"))
    assert sorted(p.name for p in (tmp_path / "dst" / name).iterdir()) == ["a"]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == [name]


def test_a_directory_swapped_for_a_link_while_packing_is_not_read_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restored copy may carry a 0o777 directory; while a root `run` packs it at release,
    another user swaps it for a link to /etc between the walk and the read. pack opened
    'notes/pub/x/secret' by path (O_NOFOLLOW guards the last component only), read the file the
    link leads to as root, and uploaded it for the session's owner to download."""
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "secret").write_text("root's secret")
    (tmp_path / "notes" / "pub" / "x").mkdir(parents=True)
    (tmp_path / "notes" / "pub" / "x" / "secret").write_text("planted")
    real_open = os.open
    swapped: list[bool] = []

    def swap_then_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if os.fspath(path).endswith("secret") and not swapped:  # the other user, just in time
            os.rename(tmp_path / "notes" / "pub" / "x", tmp_path / "notes" / "pub" / "was")
            os.symlink(tmp_path / "victim", tmp_path / "notes" / "pub" / "x")
            swapped.append(True)
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", swap_then_open)
    try:
        packed = carry.pack(["notes"], str(tmp_path), "sess-unit-swap")
    except ClientError:
        return  # refused: nothing read through the link
    finally:
        monkeypatch.undo()
    assert swapped and b"root's secret" not in b"".join(packed.chunks)


def test_a_link_target_is_at_most_what_the_kernel_makes(tmp_path: Path) -> None:
    """symlink(2) refuses a target of PATH_MAX (4,096) bytes: a copy holding one was committed and
    then failed every restore."""
    longest = "/".join(["a" * 255] * 16)  # 4,095 bytes, in names the kernel can look up
    check_entry("l", "symlink", 0o777, longest)
    os.symlink(longest, tmp_path / "l")
    with pytest.raises(CarryRefused):
        check_entry("l", "symlink", 0o777, longest + "a")
    with pytest.raises(OSError):
        os.symlink(longest + "a", tmp_path / "m")


def test_a_link_through_a_name_the_kernel_cannot_look_up_is_never_carried(tmp_path: Path) -> None:
    """A target with a name over NAME_MAX: the rules took it as a directory CMD could make, the walk
    on disk met ENAMETOOLONG, so CommitCarry accepted a copy every restore then failed."""
    with pytest.raises(CarryRefused, match="a name over 255"):
        check_entry("l", "symlink", 0o777, "ok/" + "x" * 256)
    check_entry("l", "symlink", 0o777, "ok/" + "x" * 255)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "data").write_text("state")
    os.symlink("x" * 300, tmp_path / "notes" / "dangling")
    packed = carry.pack(["notes"], str(tmp_path), "sess-long-name")
    assert [e.path for e in packed.manifest.entries] == ["", "data"]
    assert any("dangling" in why and "a name over 255" in why for why in packed.skipped), packed.skipped
    there = tmp_path / "elsewhere"
    there.mkdir()
    restore(packed.manifest, b"".join(packed.chunks), ["notes"], str(there))
    assert (there / "notes" / "data").read_text() == "state"


def test_a_hop_bomb_restores_in_time_linear_in_its_size(tmp_path: Path) -> None:
    """39 links of 4,000 bytes (800 names down, 800 up) and links each through all 39: valid, so
    the restore checks every link on disk, and os.path.realpath per link walked all 62,400
    components of each again (0.13 s a link: minutes for the thousands a manifest may hold)."""
    m = pb.CarryManifest(session_id="sess-unit-bomb", written_at_unix_ms=1)
    m.roots.add(path="notes", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    for k in range(39):
        m.entries.add(root=0, path=f"z{k}", kind="symlink", mode=0o777,
                      link_target="/".join(["a"] * 800 + [".."] * 800))
    for i in range(300):
        m.entries.add(root=0, path=f"b{i}", kind="symlink", mode=0o777,
                      link_target="/".join(f"z{k}" for k in range(39)))
    started = time.monotonic()
    restore(m, b"", ["notes"], str(tmp_path))
    assert time.monotonic() - started < 5
    assert os.readlink(tmp_path / "notes" / "b299") == "/".join(f"z{k}" for k in range(39))


def test_a_link_whose_path_is_path_max_bytes_restores(tmp_path: Path) -> None:
    """Entry paths may be PATH_MAX (4,096) bytes, which no single system call may name: the
    restore reaches each by its components, and checks the link there too."""
    dirs = ["/".join(["d" * 254] * level) for level in range(1, 17)]
    m = pb.CarryManifest(session_id="sess-unit-pathmax", written_at_unix_ms=1)
    m.roots.add(path="notes", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    for path in dirs:
        m.entries.add(root=0, path=path, kind="dir", mode=0o755)
    link = f"{dirs[-1]}/{'l' * 16}"
    assert len(link.encode()) == 4096
    m.entries.add(root=0, path=link, kind="symlink", mode=0o777, link_target="..")
    restore(m, b"", ["notes"], str(tmp_path))
    top = os.open(tmp_path / "notes", os.O_RDONLY)
    fd = files.open_beneath(top, dirs[-1].split("/"))
    try:
        assert os.readlink("l" * 16, dir_fd=fd) == ".."
    finally:
        os.close(fd)
        os.close(top)


@pytest.mark.parametrize("links", [
    [("l", "..")],
    [("s", "."), ("l", "s/s/s/../..")],
    [("a", "b"), ("b", "a")],
    [("d", "s/" * 41 + "x"), ("s", ".")],
])
def test_the_disk_check_alone_refuses_what_leaves_or_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: list[tuple[str, str]]
) -> None:
    """Should the rules ever pass a link that leaves, the check of the links as made on disk
    refuses it before anything is put in place."""
    monkeypatch.setattr(carry_restore, "check_manifest", lambda manifest: None)
    m = pb.CarryManifest(session_id="sess-unit-disk", written_at_unix_ms=1)
    m.roots.add(path="notes", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    for path, target in links:
        m.entries.add(root=0, path=path, kind="symlink", mode=0o777, link_target=target)
    with pytest.raises(ClientError, match="on disk"):
        restore(m, b"", ["notes"], str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_restore_says_which_missing_parents_it_made(tmp_path: Path) -> None:
    """The root's missing parents are made before it is built; a restore failing after that said
    'nothing was written outside its temporary directory' while they stayed."""
    m = deep_copy(0, "0" * 64)
    m.roots[0].path = "a/b/notes"
    with pytest.raises(ClientError, match=r"except the missing directories made to hold .*a/b"):
        restore(m, b"x", ["a/b/notes"], str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == []


def test_many_roots_are_judged_in_time_linear_in_their_number() -> None:
    """20,000 roots fit a manifest (670 KB); comparing each with every other took 50 s of the
    coordinator's event loop at CommitCarry, before any root was found to lack its entry."""
    m = pb.CarryManifest(session_id="sess-unit-roots")
    for i in range(20_000):
        m.roots.add(path=f"r/{i}", kind="dir")
    started = time.monotonic()
    with pytest.raises(CarryRefused, match="starts with its own entry"):
        check_manifest(m)
    assert time.monotonic() - started < 2
    m.roots.add(path="r", kind="dir")  # holds every other root
    with pytest.raises(CarryRefused, match="'r', 'r/0' overlap"):
        check_manifest(m)


@pytest.mark.parametrize("field,value", [
    ("reason", "release\nholdfast: restored notes from host trusted-host"),
    ("reason", "\x1b]0;owned\x07release"),
    ("host_id", "host-a\x1b[2J"),
    ("host_id", "a b"),
])
def test_what_a_restore_prints_of_the_copy_is_plain(field: str, value: str) -> None:
    """The uploading client fills a manifest's host id and reason, and a restore prints them to
    the next owner's terminal (root's, perhaps): a line break faked a line of holdfast's own, an
    escape sequence drove the terminal."""
    m = deep_copy(0, "0" * 64)
    m.total_bytes = 1
    for ok in ({"reason": "checkpoint", "host_id": "host-a.example_1"}, {"reason": "", "host_id": ""}):
        m.reason, m.host_id = ok["reason"], ok["host_id"]
        check_manifest(m)
    setattr(m, field, value)
    with pytest.raises(CarryRefused):
        check_manifest(m)


def test_a_root_this_run_does_not_name_is_said_without_its_control_characters(tmp_path: Path) -> None:
    """A root the restoring run did not name is the uploader's text: printed as it was, an escape
    sequence in it drove the next owner's terminal."""
    m = deep_copy(0, hashlib.sha256(b"x").hexdigest())
    m.roots.add(path="evil\x1b[2J\nholdfast: restored", kind="dir")
    m.entries.add(root=1, path="", kind="dir", mode=0o755)
    said = restore(m, b"x", ["notes"], str(tmp_path))
    assert "\x1b" not in "".join(said) and "\n" not in "".join(said)
    assert said[0].startswith("carried 'evil\\x1b[2J\\nholdfast: restored' not restored")


@pytest.mark.parametrize("failing", [("notes",), (".notes.holdfast-restore-", "/was")])
def test_a_put_in_place_that_fails_leaves_no_unsaid_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: tuple[str, ...]
) -> None:
    """The local root cannot be moved aside (a mount point, another user's in a sticky /tmp): the
    empty '.notes.holdfast-old-*' holder stayed, unsaid. The copy cannot be renamed in and the
    local root cannot be put back: the local files stayed in the holder while the message said
    nothing was put in place."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "local").write_text("mine")
    real_rename = os.rename

    def rename(src: str, dst: str, **kwargs: object) -> None:
        if any(src.startswith(f) or src.endswith(f) for f in failing):
            raise PermissionError(1, "Operation not permitted")
        real_rename(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(ClientError) as failed:
        restore(deep_copy(0, hashlib.sha256(b"x").hexdigest()), b"x", ["notes"], str(tmp_path))
    monkeypatch.undo()
    left = sorted(p.name for p in tmp_path.iterdir())
    if left == ["notes"]:
        assert (tmp_path / "notes" / "local").read_text() == "mine"
    else:
        [holder] = [name for name in left if name.startswith(".notes.holdfast-old-")]
        assert f"kept in '{holder}/was'" in failed.value.message
        assert (tmp_path / holder / "was" / "local").read_text() == "mine"


def test_judging_a_manifest_looks_up_no_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root written '~name' made check_manifest expand it, one passwd lookup a root (NSS, LDAP
    perhaps) for each of the 45,000 roots a manifest may hold, in the coordinator's event loop."""
    def no_lookup(path: str) -> str:
        raise AssertionError(f"looked up {path!r}")

    m = pb.CarryManifest(session_id="sess-unit-tilde")
    m.roots.add(path="~nobody/notes", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    monkeypatch.setattr(os.path, "expanduser", no_lookup)
    check_manifest(m)  # as written: normalised; a restoring run names its roots expanded


def test_show_describes_a_root_without_its_control_characters() -> None:
    """`holdfast show` prints every root of a copy through describe: the uploader's text."""
    m = pb.CarryManifest(session_id="sess-unit-show", written_at_unix_ms=1)
    said = describe(m, "evil\x1b]0;x\x07\n", 0, 0, 1.0)
    assert said.startswith("'evil\\x1b]0;x\\x07\\n' (0 files") and "\x1b" not in said
    assert describe(m, "notes", 0, 0, 1.0).startswith("notes (0 files")


def test_a_root_is_one_root_however_the_run_spells_it() -> None:
    """`--carry notes` and `--carry /work/notes` in /work name one root: the copy's spelling wins."""
    from holdfast.common.carry_rules import as_the_copy_names

    assert as_the_copy_names(["/work/notes", "other"], ["notes"], "/work") == ["notes", "other"]
    assert as_the_copy_names(["notes/", "./notes"], ["/work/notes"], "/work") == ["/work/notes"]
    assert as_the_copy_names(["notes"], ["notes"], "/elsewhere") == ["notes"]  # relative stays relative
    assert as_the_copy_names(["/other/notes"], ["notes"], "/work") == ["/other/notes"]


def test_a_restore_drops_group_and_other_write(tmp_path: Path) -> None:
    """A copy is another user's data: its 0777 directories and 0666 or 0777 files, restored as
    given by a root `run`, let any local user edit root's files or plant links where CMD writes."""
    body = b"echo hi\n"
    m = pb.CarryManifest(session_id="sess-unit-modes", written_at_unix_ms=1, total_bytes=2 * len(body))
    m.roots.add(path="state", kind="dir")
    m.roots.add(path="alone", kind="file")
    m.entries.add(root=0, path="", kind="dir", mode=0o777)
    m.entries.add(root=0, path="hooks", kind="dir", mode=0o775)
    m.entries.add(root=0, path="hooks/run.sh", kind="file", mode=0o777, size=len(body),
                  sha256=hashlib.sha256(body).hexdigest())
    m.entries.add(root=1, path="", kind="file", mode=0o666, size=len(body),
                  sha256=hashlib.sha256(body).hexdigest())
    restore(m, body * 2, ["state", "alone"], str(tmp_path))
    modes = {p: (tmp_path / p).stat().st_mode & 0o7777 for p in ("state", "state/hooks", "state/hooks/run.sh",
                                                                  "alone")}
    assert modes == {"state": 0o755, "state/hooks": 0o755, "state/hooks/run.sh": 0o755, "alone": 0o644}


def test_a_state_over_the_cap_is_refused_by_its_sizes_never_read_whole(tmp_path: Path) -> None:
    """A 3 GB sparse file (4 KB on disk) was read whole before any cap: under a memory limit the
    pack died of MemoryError, and the owner's release with it. In a process of 1 GB of address
    space, it is refused CARRY_TOO_LARGE, naming the cap's setting, before it is read."""
    (tmp_path / "state").mkdir()
    os.truncate(os.open(tmp_path / "state" / "sparse", os.O_CREAT | os.O_WRONLY, 0o600), 3 << 30)
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
              "from holdfast.client import carry\n"
              "from holdfast.client.errors import ClientError\n"
              "try:\n"
              "    carry.pack(['state'], sys.argv[1], 'sess-unit-sparse', cap=4 << 20)\n"
              "except ClientError as err:\n"
              "    print(err.reason, err.message)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith("CARRY_TOO_LARGE "), done.stderr[-2000:]
    assert "state/sparse (3221225472 bytes)" in done.stdout
    assert "cap of 4194304 bytes (carry_session_cap_bytes)" in done.stdout


def test_the_cap_counts_every_file_of_every_root(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(b"x" * 600)
    (tmp_path / "b").write_bytes(b"y" * 600)
    assert carry.pack(["a", "b"], str(tmp_path), "sess-unit-cap", cap=1200).manifest.total_bytes == 1200
    with pytest.raises(ClientError) as refused:
        carry.pack(["a", "b"], str(tmp_path), "sess-unit-cap", cap=1199)
    assert refused.value.reason == Reason.CARRY_TOO_LARGE
    assert "up to and with b (600 bytes), is 1200 bytes" in refused.value.message


def test_a_file_grown_past_the_cap_after_it_was_listed_is_read_no_further(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listed small, then grown while it is read: no more than the cap and a byte are read."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "log").write_bytes(b"x")
    real_read = carry.os.fdopen
    asked: list[int] = []

    class Growing:
        def __init__(self, handle: object) -> None:
            self.handle = handle

        def __enter__(self) -> Growing:
            with open(tmp_path / "state" / "log", "ab") as log:  # the writer, between open and read
                log.write(b"y" * 5000)
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()  # type: ignore[attr-defined]

        def read(self, size: int = -1) -> bytes:
            asked.append(size)
            return self.handle.read(size)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(carry.os, "fdopen", lambda fd, *a, **k: Growing(real_read(fd, *a, **k)))
    with pytest.raises(ClientError) as refused:
        carry.pack(["state"], str(tmp_path), "sess-unit-grown", cap=100)
    assert refused.value.reason == Reason.CARRY_TOO_LARGE and asked == [101], refused.value


def test_names_from_a_copy_are_said_quoted_when_the_next_owner_packs(tmp_path: Path) -> None:
    """A copy another user uploaded holds a directory whose name fakes a line of holdfast's and
    clears the terminal's line. Said as it was, each 'not carried:' line about what lies in it put
    the name raw on the next owner's terminal."""
    name = "x\n[holdfast] restored state; CMD runs\x1b[2K"
    m = pb.CarryManifest(session_id="sess-unit-names", reason="release", host_id="h1", total_bytes=0)
    m.roots.add(path="state", kind="dir")
    m.entries.add(root=0, path="", kind="dir", mode=0o755)
    m.entries.add(root=0, path=name, kind="dir", mode=0o755)
    restore(m, b"", ["state"], str(tmp_path))
    os.mkfifo(tmp_path / "state" / name / "pipe")
    os.symlink("/etc/passwd", tmp_path / "state" / name / "out")
    skipped = carry.pack(["state"], str(tmp_path), "sess-unit-names").skipped
    assert len(skipped) == 2, skipped
    assert not any("\n" in line or "\x1b" in line for line in skipped), skipped
    assert all(line.startswith(repr(f"state/{name}/")[:-1]) for line in skipped), skipped


ME, NOBODY = 0, 65534
OTHERS_MAY = "shared"  # check_ancestors' reason: another user may change the directory or one above
ANOTHER_DIR = "its directory is not the one it was when the run started"
ANOTHER_ROOT = "it is not the file or directory it was when the run started"
DIR, DIR2, FILE, FILE2 = (1, 10, ME), (1, 11, ME), (1, 20, ME), (1, 21, ME)


def test_an_unchanged_root_is_uploaded_wherever_it_stands_and_whoever_owns_it() -> None:
    start = Place(DIR, (1, 20, NOBODY))
    assert moved_because(start, DIR, (1, 20, NOBODY), OTHERS_MAY, ME) is None
    assert moved_because(Place(DIR, None), DIR, None, OTHERS_MAY, ME) is None, "still absent"
    assert moved_because(start, DIR, None, OTHERS_MAY, ME) is None, "absent now: nothing to upload"


@pytest.mark.parametrize(("start", "directory", "root", "what"), [
    (Place(DIR, None), DIR, FILE2, "it did not exist when the run started"),
    (Place(DIR, FILE), DIR, FILE2, ANOTHER_ROOT),
    (Place(DIR, FILE), DIR2, FILE2, ANOTHER_DIR),
    (Place(DIR, FILE), DIR2, FILE, ANOTHER_DIR),
    (Place(DIR, None), DIR2, None, ANOTHER_DIR),
], ids=["absent then", "deleted and made again", "its directory replaced", "its directory moved",
        "its directory replaced, the root still absent"])
def test_a_changed_root_is_uploaded_only_where_no_other_user_may_have_put_it(
    start: Place, directory: Identity, root: Identity | None, what: str
) -> None:
    """Another file, directory or holding directory than at the start — a root absent then
    included — is CMD's own (a rename over it, a directory replaced by a rename) only where no other
    user may change its directory or one above it, and it is the running user's. Else another user
    renamed root's secret to its name in their directory, or made it themselves in a sticky one."""
    assert moved_because(start, directory, root, None, ME) is None, "CMD's own"
    assert moved_because(start, directory, root, OTHERS_MAY, ME) == (
        f"{what}, and another user may change the directory holding it or one above it (shared): they "
        "could have put it there")
    if root is not None:  # in a sticky directory other users may create names: theirs is not CMD's
        assert moved_because(start, directory, (root[0], root[1], NOBODY), None, ME) == (
            f"{what}, and uid 65534 owns it, not uid 0 that runs this: another user put it there")


def test_a_freed_inode_number_given_to_another_users_file_is_another_root() -> None:
    """CMD deletes root's file and another user makes one at its name: the kernel may give it the
    freed inode number, so the owner is part of what is compared."""
    assert moved_because(Place(DIR, FILE), DIR, (1, 20, NOBODY), None, ME) == (
        f"{ANOTHER_ROOT}, and uid 65534 owns it, not uid 0 that runs this: another user put it there")


def test_pack_refuses_a_root_whose_directory_was_replaced_where_others_may_and_keeps_cmds_own(
    tmp_path: Path
) -> None:
    (tmp_path / "home" / "notes").mkdir(parents=True)
    (tmp_path / "home" / "state.json").write_text("v1")
    (tmp_path / "home" / "notes" / "a").write_text("a")
    names = ["state.json", "notes"]
    _, seen = carry.measure(names, str(tmp_path / "home"), "sess-unit-seen", "")
    # CMD writes its file by a rename over it, in a directory no other user may change: carried.
    (tmp_path / "home" / "state.json.new").write_text("v2")
    os.rename(tmp_path / "home" / "state.json.new", tmp_path / "home" / "state.json")
    packed = carry.pack(names, str(tmp_path / "home"), "sess-unit-seen", seen)
    assert [r.path for r in packed.manifest.roots] == names and b"".join(packed.chunks) == b"v2a"

    def replace_home(state: str) -> None:
        os.rename(tmp_path / "home", tmp_path / "home.old")
        shutil.copytree(tmp_path / "home.old", tmp_path / "home")
        shutil.rmtree(tmp_path / "home.old")
        (tmp_path / "home" / "state.json").write_text(state)

    # CMD replaces the directory holding the roots by a rename, where no other user may: carried.
    replace_home("v3")
    packed = carry.pack(names, str(tmp_path / "home"), "sess-unit-seen", seen)
    assert b"".join(packed.chunks) == b"v3a"
    # Where another user may change a directory above it, another directory is never the run's.
    _, seen = carry.measure(names, str(tmp_path / "home"), "sess-unit-seen", "")
    os.chmod(tmp_path, 0o777)
    replace_home("v4")
    with pytest.raises(ClientError, match=r"state\.json: its directory is not the one it was .*another "
                       r"user may change") as refused:
        carry.pack(names, str(tmp_path / "home"), "sess-unit-seen", seen)
    assert refused.value.reason == Reason.CARRY_FAILED
    assert "the last good copy stands" in refused.value.message
    # So too before CMD starts, measured again after the restore: CMD does not run.
    with pytest.raises(ClientError, match=r"its directory is not the one .*; CMD did not run") as before:
        carry.measure(names, str(tmp_path / "home"), "sess-unit-seen", "CMD did not run", seen)
    assert before.value.reason == Reason.CARRY_FAILED


def test_pack_refuses_a_root_absent_at_the_start_that_another_user_may_have_put_there(tmp_path: Path) -> None:
    """A root absent when CMD started is refused (CARRY_FAILED, not left out) when another user may
    change its directory, or when it is not this user's; carried when CMD made it in its own."""
    home = tmp_path / "home"
    home.mkdir()
    _, seen = carry.measure(["out"], str(home), "sess-unit-absent", "")
    (home / "out").write_text("made by CMD")
    assert b"".join(carry.pack(["out"], str(home), "sess-unit-absent", seen).chunks) == b"made by CMD"
    os.chmod(home, 0o777)
    with pytest.raises(ClientError, match=r"out: it did not exist when the run started, and another user "
                       "may change") as refused:
        carry.pack(["out"], str(home), "sess-unit-absent", seen)
    assert refused.value.reason == Reason.CARRY_FAILED


OPEN = "others may write it"  # files.swappable_because's answer for a directory others may change
NOT_YOURS = "uid 65534 owns it, not uid 0 that runs this"


@pytest.mark.parametrize(("mode", "swappable", "why"), [
    (0o40755, None, None),
    (0o40775, None, None),  # group write that swappable_because found this user's alone
    (0o41755, None, None),  # sticky, yet none but its owner may write it
    (0o40777, OPEN, OPEN),
    (0o41777, None, "it is sticky and others may write it (mode 1777): they make names in it"),
    (0o41775, None, "it is sticky and others may write it (mode 1775): they make names in it"),
])
def test_a_directory_is_open_where_another_user_may_make_a_name_in_it(
    mode: int, swappable: str | None, why: str | None
) -> None:
    """Sticky stops others renaming this user's entries, not making names: a hard link among them."""
    assert names_open_because(mode, swappable) == why


USER = 1000  # a run not as root


@pytest.mark.parametrize(("kind", "uid", "euid", "names_open", "why"), [
    ("file", ME, ME, OPEN, None),  # a file's names: linked_outside_because's
    ("dir", ME, ME, None, None),
    ("symlink", ME, ME, None, None),
    ("file", NOBODY, ME, None, f"{NOT_YOURS}: another user's file would be carried, and restored, as yours "
                                "(`chown -R 0 out` makes the files yours)"),
    ("dir", NOBODY, ME, None, f"{NOT_YOURS}: another user's dir would be carried"),
    ("symlink", NOBODY, ME, None, f"{NOT_YOURS}: another user's symlink would be carried"),
    ("dir", ME, ME, OPEN, f"another user may make names in it ({OPEN}): their files, or hard links to yours"),
    # A run not as root takes root's entries (a file a sudo left in ~/.codex): root is trusted, and
    # its file is read as this user. Another user's are refused with a chown that works: as root.
    ("file", 0, USER, None, None),
    ("dir", 0, USER, None, None),
    ("symlink", 0, USER, None, None),
    ("dir", 0, USER, OPEN, f"another user may make names in it ({OPEN})"),
    ("file", NOBODY, USER, None, "uid 65534 owns it, not uid 1000 that runs this: another user's file "
                                 "would be carried, and restored, as yours (`chown -R 1000 out`, run as "
                                 "root, makes the files yours)"),
])
def test_an_entry_is_carried_only_if_it_is_the_users_or_roots_and_no_other_user_may_make_names_in_it(
    kind: str, uid: int, euid: int, names_open: str | None, why: str | None
) -> None:
    got = not_carried_because(kind, uid, euid, names_open, "out")
    assert got == why if why is None else (got or "").startswith(why), got


@pytest.mark.parametrize(("nlink", "inside", "why"), [
    (1, 1, None),
    (2, 2, None),  # CMD's own link within the root
    (2, 1, "it has 2 names (hard-linked), 1 outside the carried root, and hard links are not protected on "
           "this host (fs.protected_hardlinks is not 1): it may be a file from elsewhere that another user "
           "linked in, whatever the directory modes are now"),
    (3, 2, "it has 3 names (hard-linked), 1 outside the carried root"),
])
def test_where_links_are_not_protected_a_file_is_carried_only_if_every_name_it_has_is_in_the_root(
    nlink: int, inside: int, why: str | None
) -> None:
    """A link planted while a directory was open outlives its closing: only the count tells."""
    got = linked_outside_because(nlink, inside, links_protected=False)
    assert got == why if why is None else (got or "").startswith(why), got


@pytest.mark.parametrize(("nlink", "inside"), [(1, 1), (2, 1), (3, 2), (5, 1)])
def test_where_links_are_protected_names_outside_the_root_are_carried(nlink: int, inside: int) -> None:
    """A local `git clone` hard-links every object to the source repository, uv, conda and pnpm
    link from their caches: each was refused, and a session's work silently not carried. Where
    the kernel protects hard links no other user may have linked in a file they could not read
    and write already."""
    assert linked_outside_because(nlink, inside, links_protected=True) is None


@pytest.mark.parametrize(("setting", "protected"), [
    ("1\n", True), ("1", True), ("0\n", False), ("2\n", False), ("", False), (None, False),
])
def test_only_a_protected_hardlinks_of_1_protects_and_one_not_read_does_not(
    setting: str | None, protected: bool
) -> None:
    assert hardlinks_protected(setting) is protected


def links_protected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setting: str | None) -> None:
    """Packing as if fs.protected_hardlinks read `setting` (None: it cannot be read), not changed
    host-wide."""
    sysctl = tmp_path / "protected_hardlinks"
    if setting is not None:
        sysctl.write_text(setting)
    monkeypatch.setattr(carry, "PROTECTED_HARDLINKS", str(sysctl))


def refused_pack(names: list[str], cwd: Path, match: str) -> None:
    with pytest.raises(ClientError, match=match) as refused:
        carry.pack(names, str(cwd), "sess-unit-entries")
    assert refused.value.reason == Reason.CARRY_FAILED
    assert "nothing of this copy was kept (the last good copy stands)" in refused.value.message


@pytest.mark.parametrize(("made", "kind"), [("drop", "dir"), ("sub/config", "file"), ("sub/link", "symlink")])
def test_pack_refuses_another_users_entry_anywhere_in_a_directory_root(
    tmp_path: Path, made: str, kind: str
) -> None:
    """Root's `out` held nobody's `drop/` (or file, or link): what nobody wrote there was carried
    and restored on the next host as root's. The whole copy is refused, naming the entry."""
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "kept").write_text("root's")
    assert carry.pack(["out"], str(tmp_path), "sess-unit-entries").manifest.total_bytes == 6
    path = tmp_path / "out" / made
    if kind == "dir":
        path.mkdir()
    elif kind == "symlink":
        os.symlink("kept", path)
    else:
        path.write_text("nobody-planted")
    os.lchown(path, NOBODY, NOBODY)
    refused_pack(["out"], tmp_path, f"--carry out: out/{made}: {NOT_YOURS}: another user's {kind}")
    path.rmdir() if kind == "dir" else path.unlink()
    os.chown(tmp_path / "out", NOBODY, NOBODY)
    refused_pack(["out"], tmp_path, f"--carry out: {NOT_YOURS}")


@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_pack_refuses_a_directory_in_a_root_that_another_user_may_make_names_in(
    tmp_path: Path, mode: int
) -> None:
    """Nobody could put a hard link to root's secret in it (fs.protected_hardlinks 0): root's own
    file, one name more, carried for them to restore. Refused whether or not anything is there yet."""
    (tmp_path / "out" / "pub").mkdir(parents=True)
    os.chmod(tmp_path / "out" / "pub", mode)
    refused_pack(["out"], tmp_path, r"--carry out: out/pub: another user may make names in it")
    os.chmod(tmp_path / "out" / "pub", 0o755)
    os.chmod(tmp_path / "out", mode)
    refused_pack(["out"], tmp_path, r"--carry out: another user may make names in it")


def test_pack_carries_cmds_own_hard_links_within_the_root(tmp_path: Path) -> None:
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "out" / "a" / "f").write_text("one")
    os.link(tmp_path / "out" / "a" / "f", tmp_path / "out" / "g")
    assert b"".join(carry.pack(["out"], str(tmp_path), "sess-unit-entries").chunks) == b"oneone"


@pytest.mark.parametrize("setting", ["0\n", None])
def test_pack_refuses_a_file_with_a_name_outside_the_root_whatever_the_modes_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None
) -> None:
    """Nobody linked root's secret into `out/drop` while it was 0777 (fs.protected_hardlinks 0, or
    not readable); root closed `drop` as the refusal advised, and the link, left there, was carried.
    A name outside the root refuses it, in a closed directory, and for a file root wherever it stands."""
    links_protected(monkeypatch, tmp_path, setting)
    (tmp_path / "secret").write_text("TOPSECRET")
    (tmp_path / "out" / "drop").mkdir(parents=True)
    os.link(tmp_path / "secret", tmp_path / "out" / "drop" / "loot")
    refused_pack(["out"], tmp_path, r"--carry out: out/drop/loot: it has 2 names \(hard-linked\), 1 outside "
                 "the carried root")
    os.link(tmp_path / "secret", tmp_path / "out" / "also")
    refused_pack(["out"], tmp_path, r"--carry out: out/also: it has 3 names \(hard-linked\), 1 outside")
    refused_pack(["secret"], tmp_path, r"--carry secret: it has 3 names \(hard-linked\), 2 outside")
    os.unlink(tmp_path / "secret")
    assert b"".join(carry.pack(["out"], str(tmp_path), "sess-unit-entries").chunks) == b"TOPSECRET" * 2
    os.unlink(tmp_path / "out" / "also")
    assert b"".join(carry.pack(["out/drop/loot"], str(tmp_path), "sess-unit-entries").chunks) == b"TOPSECRET"


def test_pack_carries_files_with_names_outside_the_root_where_hard_links_are_protected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree whose files are hard-linked from elsewhere (a local clone's objects, a package
    cache's files), and a file root with another name, are carried where the kernel protects links."""
    links_protected(monkeypatch, tmp_path, "1\n")
    (tmp_path / "cache").write_text("cached")
    (tmp_path / "out" / "objects").mkdir(parents=True)
    os.link(tmp_path / "cache", tmp_path / "out" / "objects" / "ab")
    assert b"".join(carry.pack(["out"], str(tmp_path), "sess-unit-entries").chunks) == b"cached"
    assert b"".join(carry.pack(["cache"], str(tmp_path), "sess-unit-entries").chunks) == b"cached"
