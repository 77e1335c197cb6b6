"""Restoring a session's carried copy on this host (`run --carry`, docs/carry.md): each root this
run names is built in a temporary directory beside it, checked, and renamed into place.

Guarantee: a copy that `carry_rules.check_manifest` refuses writes nothing. Otherwise nothing is
created, written or renamed except beneath the directory that holds the root, opened once when the
restore starts: every entry is reached one component at a time from that directory's descriptor
with O_NOFOLLOW, so no link — one of the copy's, or one another user plants meanwhile — is ever
followed to write. The copy's links are made last, after every file and directory, and resolved on
disk beneath the root before anything is put in place. Nothing is put in place until every named
root is built; a failed restore removes what it built and says what, if anything, was put in place.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.common.carry_rules import (
    CarryRefused,
    check_manifest,
    describe,
    restored_mode,
    root_name,
    shown_root,
)
from holdfast.common.files import open_beneath, open_user_dir, remove_tree
from holdfast.common.link_rules import MAX_LINK_HOPS, LinkEnds
from holdfast.common.reasons import Reason
from holdfast.v1 import coordinator_pb2 as pb

T = TypeVar("T")
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_NAME = "file"  # a carried file's name inside its temporary directory


def _failed(message: str, session: str) -> ClientError:
    return ClientError(Reason.CARRY_FAILED, message, session)


def _walk(top: int, parts: Sequence[str]) -> int:
    """A new descriptor on the directory `parts` below `top`, each component opened with
    O_NOFOLLOW: a link or a file where a directory was built is refused, never followed."""
    try:
        return open_beneath(top, parts)
    except OSError as exc:
        raise CarryRefused(
            f"{'/'.join(parts)!r} is not a directory this restore made ({exc.strerror})"
        ) from None


def _open_own_dir(parent: int, name: str) -> int:
    """A descriptor on the directory `name` this restore just made in `parent`; OSError, with
    nothing touched, if another user swapped it meanwhile for a link or a directory of theirs."""
    try:
        return files.open_own_dir(parent, name)
    except OSError as exc:
        raise OSError(exc.errno, "the directory this restore made beside it was replaced: nothing moved "
                      f"through it ({exc.strerror})", name) from None


def _write_file(directory: int, name: str, data: bytes, entry: pb.CarryEntry) -> None:
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CarryRefused(f"carry entry {entry.path or '(the carried file)'!r} does not match its sha256")
    with open(os.open(name, CREATE_FILE, 0o600, dir_fd=directory), "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), restored_mode(entry.mode))


class _OnDisk:
    """The tree below the directory open as `top`, as the kernel would walk it: every name looked
    up with lstat beneath `top` (a filesystem that folds names is judged by what it finds, not by
    what the manifest says), a place being the list of components below `top`, a link known by its
    inode."""

    def __init__(self, top: int) -> None:
        self.top = top

    def _at(self, here: list[str], name: str, op: Callable[[str, int], T]) -> T:
        try:
            return op("/".join([*here, name]), self.top)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
        fd = open_beneath(self.top, here)  # a path of PATH_MAX bytes, which no one call may name
        try:
            return op(name, fd)
        finally:
            os.close(fd)

    def lookup(self, here: list[str], name: str) -> os.stat_result | None:
        try:
            return self._at(here, name, lambda p, d: os.stat(p, dir_fd=d, follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def up(self, here: list[str]) -> list[str] | None:
        return here[:-1] if here else None

    def find(self, here: list[str], name: str) -> tuple[list[str], tuple[int, int] | None] | None:
        found = self.lookup(here, name)
        if found is None:
            return None
        return [*here, name], (found.st_dev, found.st_ino) if stat.S_ISLNK(found.st_mode) else None

    def target(self, here: list[str], name: str) -> list[str]:
        return self._at(here, name, lambda p, d: os.readlink(p, dir_fd=d)).split("/")


def _escaping_on_disk(top: int, links: Sequence[str]) -> str | None:
    """The first of `links` (paths below the directory open as `top`) that is not a link on disk,
    or that, followed on disk as the kernel follows it (link_rules.LinkEnds: each link read back
    with readlink, its end worked out once and remembered by its inode), leaves `top` or loops;
    None when none does."""
    tree = _OnDisk(top)
    ends = LinkEnds(tree)
    for path in links:
        *parent, name = path.split("/")
        found = tree.find(parent, name)
        if found is None or found[1] is None or ends.resolve(parent, name, found[1]) is None:
            return path  # not the link this restore made, or one that leaves the root
    return None


@dataclass
class _Root:
    """One named root being restored: the directory that holds it, opened once, and the
    temporary directory beneath it where the copy is built."""

    root: pb.CarryRoot
    entries: list[tuple[pb.CarryEntry, bytes]]
    path: str
    parent: int = -1
    temp: str = ""
    temp_fd: int = -1
    placed: bool = False
    notes: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # missing parents made to hold it, outermost first

    @property
    def base(self) -> str:
        return os.path.basename(self.path)

    def beside(self, what: str) -> str:
        """The prefix of a temporary name beside the root: the root's name cut to 64 bytes, since
        a root may be named with up to NAME_MAX bytes and the whole name must fit it too."""
        return f".{self.base.encode()[:64].decode(errors='ignore')}.holdfast-{what}-"

    def open(self) -> None:
        directory = os.path.dirname(self.path) or "."
        # The directory this run's own --carry names (its parents are the user's path, made if
        # missing, and said if the restore then fails; a link on the way is followed only when it
        # is this user's or root's in directories no other user may change — never one in another
        # user's home, whoever made it); everything below it is reached from this one descriptor.
        self.parent, self.made = open_user_dir(directory, make=True)
        self.temp = files.make_dir(self.parent, self.beside("restore"))
        self.temp_fd = os.open(self.temp, OPEN_DIR, dir_fd=self.parent)

    def build(self) -> None:
        if self.root.kind == "file":
            entry, data = self.entries[0]
            _write_file(self.temp_fd, FILE_NAME, data, entry)
            return
        dirs: list[pb.CarryEntry] = []
        links: list[pb.CarryEntry] = []
        for entry, data in self.entries:
            if entry.kind == "symlink":
                links.append(entry)  # made last: no file or directory is ever made through one
                continue
            if entry.kind == "dir":
                dirs.append(entry)
                if not entry.path:
                    continue
            self._make(entry, data)
        for entry in links:
            self._make(entry, b"")
        escaping = _escaping_on_disk(self.temp_fd, [entry.path for entry in links])
        if escaping is not None:
            raise CarryRefused(
                f"carry entry {escaping!r}: its link resolves outside the carried directory on disk, "
                f"or through more than {MAX_LINK_HOPS} links"
            )
        for entry in sorted(dirs, key=lambda e: e.path.count("/") + bool(e.path), reverse=True):
            fd = _walk(self.temp_fd, entry.path.split("/") if entry.path else [])
            try:
                os.fchmod(fd, restored_mode(entry.mode))  # deepest first, once everything beneath is written
            finally:
                os.close(fd)

    def _make(self, entry: pb.CarryEntry, data: bytes) -> None:
        parent, _, name = entry.path.rpartition("/")
        fd = _walk(self.temp_fd, parent.split("/") if parent else [])
        try:
            if entry.kind == "dir":
                os.mkdir(name, 0o700, dir_fd=fd)
            elif entry.kind == "symlink":
                os.symlink(entry.link_target, name, dir_fd=fd)
            else:
                _write_file(fd, name, data, entry)
        finally:
            os.close(fd)

    def put_in_place(self) -> None:
        if self.root.kind == "file":
            os.replace(FILE_NAME, self.base, src_dir_fd=self.temp_fd, dst_dir_fd=self.parent)
            self.placed = True
            return
        try:
            os.lstat(self.base, dir_fd=self.parent)
        except FileNotFoundError:
            os.rename(self.temp, self.base, src_dir_fd=self.parent, dst_dir_fd=self.parent)
            self.placed = True
            return
        old = files.make_dir(self.parent, self.beside("old"))
        # The holder is opened at once and everything moved through its descriptor, never by the
        # name `old/was`: in a directory others may write without the sticky bit, `old` swapped for
        # a link would move the previous tree wherever that link leads.
        held = _open_own_dir(self.parent, old)
        try:
            self._replace_through(old, held)
        finally:
            os.close(held)

    def _replace_through(self, old: str, held: int) -> None:
        """The previous tree moved into `old` (open as `held`), the new one renamed into place."""
        try:
            os.rename(self.base, "was", src_dir_fd=self.parent, dst_dir_fd=held)
        except OSError:  # a mount point, another user's name in a sticky directory: no holder left
            os.rmdir(old, dir_fd=self.parent)
            raise
        try:
            os.rename(self.temp, self.base, src_dir_fd=self.parent, dst_dir_fd=self.parent)
        except OSError:
            try:
                os.rename("was", self.base, src_dir_fd=held, dst_dir_fd=self.parent)
                os.rmdir(old, dir_fd=self.parent)
            except OSError as exc:
                self.notes.append(f"what was there before is kept in '{old}/was' beside it ({exc.strerror})")
            raise
        self.placed = True
        try:
            remove_tree(held, "was")
            os.rmdir(old, dir_fd=self.parent)
        except OSError as exc:
            self.notes.append(f"what was there before is kept in {old!r} beside it ({exc.strerror})")

    def close(self) -> None:
        """Removes the temporary directory if it is still there (fd-based: no link followed)."""
        if self.temp_fd >= 0:
            os.close(self.temp_fd)
            self.temp_fd = -1
        if self.parent < 0:
            return
        if self.temp and not (self.placed and self.root.kind == "dir"):
            try:
                remove_tree(self.parent, self.temp)
            except OSError as exc:
                self.notes.append(
                    f"its temporary directory {self.temp!r} beside it could not be removed ({exc.strerror})"
                )
        os.close(self.parent)
        self.parent = -1


def _by_root(manifest: pb.CarryManifest, data: bytes) -> list[list[tuple[pb.CarryEntry, bytes]]]:
    trees: list[list[tuple[pb.CarryEntry, bytes]]] = [[] for _ in manifest.roots]
    offset = 0
    for entry in manifest.entries:
        size = entry.size if entry.kind == "file" else 0
        trees[entry.root].append((entry, data[offset : offset + size]))
        offset += size
    return trees


def restore(manifest: pb.CarryManifest, data: bytes, names: list[str], cwd: str) -> list[str]:
    """Puts each root of the copy that this run names in place; what it did, as lines to say.
    Raises CARRY_FAILED, saying what, if anything, was put in place."""
    sid = manifest.session_id
    try:
        check_manifest(manifest)
        if len(data) != manifest.total_bytes:
            raise CarryRefused(f"it holds {len(data)} bytes, its manifest {manifest.total_bytes}")
    except CarryRefused as exc:
        raise _failed(f"the session's carried copy is refused: {exc}; nothing was written", sid) from None
    roots: list[_Root] = []
    try:
        said = _restore_named(manifest, data, names, cwd, roots)
    except ClientError as err:
        raise _failed("; ".join([err.message, *_close(roots)]), sid) from None
    except BaseException:
        _close(roots)
        raise
    return said + [f"but {note}" for note in _close(roots)]


def _close(roots: list[_Root]) -> list[str]:
    for current in roots:
        current.close()
    return [f"restoring {r.root.path}: {note}" for r in roots for note in r.notes]


def _restore_named(
    manifest: pb.CarryManifest, data: bytes, names: list[str], cwd: str, roots: list[_Root]
) -> list[str]:
    """Builds every named root (appending each to `roots` as it is begun), then puts each in place."""
    said: list[str] = []
    for root, entries in zip(manifest.roots, _by_root(manifest, data), strict=True):
        if root.path not in names:
            said.append(
                f"carried {shown_root(root.path)} not restored: this run does not name it with --carry"
            )
            continue
        current = _Root(root, entries, os.path.join(cwd, root.path))  # an absolute path stays itself
        roots.append(current)
        try:
            root_name(root.path)
            current.open()
            current.build()
        except (CarryRefused, OSError) as exc:
            made = [d for r in roots for d in r.made]
            raise _failed(
                f"restoring {root.path}: {exc}; nothing of the carried state was put in place, and "
                "nothing was written outside its temporary directory, which is removed"
                + (f", except the missing directories made to hold the roots ({', '.join(made)}), which "
                   "are left" if made else ""),
                manifest.session_id,
            ) from None
    placed: list[str] = []
    for current in roots:
        try:
            current.put_in_place()
        except OSError as exc:
            already = f"already put in place: {', '.join(placed)}" if placed else "nothing was put in place"
            raise _failed(
                f"putting {current.root.path} in place: {exc}; {already}", manifest.session_id
            ) from None
        placed.append(current.root.path)
        files = sum(1 for e, _ in current.entries if e.kind == "file")
        size = sum(e.size for e, _ in current.entries if e.kind == "file")
        said.append(f"restored {describe(manifest, current.root.path, files, size, time.time())}")
    return said
