"""Files and places another user controls, met by a root `run` on its own host: a FIFO renamed over
a file between its lstat and its open is never waited on (pack, and copy_tree for a dir guard's
bump), and a restore's holder of the previous tree swapped for a link moves nothing through it.
Each swap is made for real on disk, at the very point the other user would make it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.client import carry, carry_restore
from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.v1 import coordinator_pb2 as pb


def finishes(work: Callable[[], None], fifo: Path) -> list[BaseException]:
    """Runs `work` on a thread; what it raised, once it returned within 5 s. Else the FIFO it is
    stuck opening is given a writer (so the thread ends) and the test fails."""
    raised: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test
            raised.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(5):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        done.wait(5)
        pytest.fail(f"blocked opening the FIFO at {fifo}")
    return raised


def test_pack_never_opens_a_fifo_swapped_in_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0o777 directory in a carried root (carried modes are restored): another user renames a
    FIFO over a file between the walk's lstat and the read's open; the open waited for a writer
    forever and a root `run` never released."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    listed = carry._listed

    def then_swapped(directory: int) -> carry.Listed:
        found = listed(directory)
        os.rename(tmp_path / "fifo", root / "f")  # the other user, after the lstat
        return found

    monkeypatch.setattr(carry, "_listed", then_swapped)
    raised = finishes(lambda: carry.pack(["notes"], str(tmp_path), "sess-fifo-01"), root / "f")
    assert len(raised) == 1 and isinstance(raised[0], ClientError), raised
    assert "notes/f was replaced by something else while it was read" in raised[0].message


def test_pack_reads_no_other_file_renamed_over_a_root_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file root: another regular file renamed over it after the lstat is not the one listed."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "theirs").write_text("theirs")
    real_stat = carry.os.stat

    def stat_then_swap(*args: object, **kwargs: object) -> os.stat_result:
        found = real_stat(*args, **kwargs)  # type: ignore[arg-type]
        if args[0] == "notes.txt" or str(args[0]).endswith("/notes.txt"):
            os.rename(tmp_path / "theirs", tmp_path / "notes.txt")
        return found

    monkeypatch.setattr(carry.os, "stat", stat_then_swap)
    with pytest.raises(ClientError, match=r"notes\.txt was replaced by something else"):
        carry.pack(["notes.txt"], str(tmp_path), "sess-fifo-02")


def test_copy_tree_never_opens_a_fifo_swapped_in_after_its_lstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dir guard's bump copies a generation a stale writer may still change: the same window in
    copy_tree."""
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    (source / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    copy_file = files._copy_file

    def swapped_then_copied(src: int, dst: int, name: str, st: os.stat_result,
                            left: int) -> tuple[int, os.stat_result]:
        os.rename(tmp_path / "fifo", source / name)  # the other writer, after copy_tree's lstat
        return copy_file(src, dst, name, st, left)

    monkeypatch.setattr(files, "_copy_file", swapped_then_copied)
    skipped: list[list[str]] = []
    src, dst = os.open(source, os.O_RDONLY), os.open(target, os.O_RDONLY)
    try:
        raised = finishes(lambda: skipped.append(files.copy_tree(src, dst, 1 << 20)), source / "f")
    finally:
        os.close(src)
        os.close(dst)
    assert raised == [] and skipped == [["'f' (replaced by a FIFO while copied)"]]  # left out, saying so
    assert list(target.iterdir()) == []


def test_put_in_place_moves_nothing_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root in a directory others may write without the sticky bit: the holder of the previous
    tree is swapped for a link right after it is made, and the rename of the previous tree into
    it by name followed the link, moving it outside the root's directory."""
    shared, outside = tmp_path / "project", tmp_path / "outside"
    shared.mkdir()
    os.chmod(shared, 0o777)
    outside.mkdir()
    (shared / "notes").mkdir()
    (shared / "notes" / "mine").write_text("previous state")
    manifest = pb.CarryManifest(session_id="sess-old-01", fence=1, written_at_unix_ms=1)
    manifest.roots.add(path="notes", kind="dir")
    manifest.entries.add(root=0, path="", kind="dir", mode=0o755)
    made = files.make_dir

    def swapped(parent: int, prefix: str) -> str:
        name = made(parent, prefix)
        if "-old-" in prefix:  # the other user, right after it is made
            os.rename(name, name + ".x", src_dir_fd=parent, dst_dir_fd=parent)
            os.symlink(outside, name, dir_fd=parent)
        return name

    monkeypatch.setattr(files, "make_dir", swapped)
    with pytest.raises(ClientError, match="putting notes in place"):
        carry_restore.restore(manifest, b"", ["notes"], str(shared))
    assert os.listdir(outside) == []
    assert (shared / "notes" / "mine").read_text() == "previous state"
