"""Carried state on the client's side (`run --carry PATH`, docs/carry.md): packing the named files
and directories, uploading them under the owner's grant, and restoring the session's last copy
before CMD runs.

Guarantee: a restore writes nothing in place until the whole copy is downloaded, every chunk and
every file matches its sha256, and the manifest passed `carry_rules.check_manifest`; it is built
beneath a directory it opened itself, never through a link (holdfast.client.carry_restore), and
renamed into place, so a failed restore leaves the local files as they were. A copy is checked by
the same rules before it is uploaded. An upload reads each file once and refuses one that changed
while it was read; the coordinator keeps the last committed copy until a whole new one is committed.
Measuring and packing reach each root as the restore does: through the directory holding it,
opened one component at a time with a link followed only when this user or root made it where no
other user may change it (files.open_user_dir), then the root's name beneath that descriptor
without following a link. Each upload (the end's and every checkpoint) takes a root that is another
file or directory than when CMD started (one absent then included), or in another directory, only
where no other user may have put it there: none may change its directory or one above it
(files.check_ancestors), and it is the running user's (carry_rules.moved_because); else nothing of
the copy is uploaded: a root `run` never uploads what another user put on the path — root's own
file renamed to the root's name, which that user could then restore with a run of their own, or
that user's file, carried as root's. Nor what another user put in it: every entry packed — the
root, and each file, directory and link below a directory root — must be the running user's (or,
for a run not as root, root's), no directory in the root one another user may make names in
(carry_rules.not_carried_because), and, where hard links are not protected (fs.protected_hardlinks,
read once a pack), no regular file may have a name outside the root
(carry_rules.linked_outside_because: a hard link planted while a directory was open stays once
it is closed); else, too, nothing of the copy is uploaded. Files are read as the running user: one
it cannot read refuses the copy (CARRY_FAILED).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from holdfast.client.carry_restore import restore
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common.carry_rules import (
    MANIFEST_BYTES,
    MAX_SESSION_CAP,
    UPLOAD_FIELDS_BYTES,
    CarryRefused,
    Identity,
    Place,
    as_the_copy_names,
    check_cap,
    check_entry,
    check_manifest,
    chunked,
    escaping_links,
    hardlinks_protected,
    linked_outside_because,
    moved_because,
    names_open_because,
    not_carried_because,
    over_cap,
    root_name,
    root_sizes,
    shown_root,
)
from holdfast.common.files import (
    Replaced,
    check_ancestors,
    open_beneath,
    open_listed,
    open_user_dir,
    swappable_because,
)
from holdfast.common.reasons import Reason
from holdfast.v1 import coordinator_pb2 as pb

PROTECTED_HARDLINKS = "/proc/sys/fs/protected_hardlinks"
NOT_A_ROOT = "not a regular file or a directory (name the file or directory itself, not a link or a device)"


OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def failed(message: str, session: str = "") -> ClientError:
    return ClientError(Reason.CARRY_FAILED, message, session)


@dataclass
class Packed:
    """A copy ready to upload: its manifest (roots, entries, chunk hashes) and its chunks."""

    manifest: pb.CarryManifest
    chunks: list[bytes]
    skipped: list[str] = field(default_factory=list)  # what was not carried, and why


def _where(name: str, cwd: str) -> str:
    return name if os.path.isabs(name) else os.path.join(cwd, name)


class _Oversize(Exception):
    """A file larger than what is left of the cap, as its lstat, its fstat or its read found it."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _read_whole(path: str, shown: str, listed: os.stat_result, directory: int | None,
                most: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file `listed` by its lstat (`path` in the directory open as
    `directory`, if given), refused if it changed while it was read (size or modification time) or
    was replaced since its lstat: a FIFO renamed over it is never waited on (open_listed). More
    than `most` bytes is _Oversize, and at most `most` + 1 are ever read: a sparse file of 3 GB
    (4 KB on disk) read whole ended a release in MemoryError, its session left live."""
    if listed.st_size > most:
        raise _Oversize(listed.st_size)
    try:
        fd = open_listed(path, directory, listed)
    except Replaced:
        raise failed(f"{shown} was replaced by something else while it was read; nothing of this copy "
                     "was kept (the last good copy stands)") from None
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, shown) from None  # named as the user knows it
    try:
        before = os.fstat(fd)
        if before.st_size > most:
            raise _Oversize(before.st_size)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(most + 1)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if len(data) > most:
        raise _Oversize(max(len(data), after.st_size))
    if (len(data), before.st_mtime_ns) != (
        after.st_size,
        after.st_mtime_ns,
    ) or before.st_size != after.st_size:
        raise failed(
            f"{shown} changed while it was read; nothing of this copy was kept (the last good copy stands)"
        )
    return data, before


Listed = list[tuple[str, os.stat_result]]


def _listed(directory: int) -> Listed:
    """The names in the directory open as `directory`, sorted, each with its lstat."""
    found: Listed = []
    for name in sorted(os.listdir(directory)):
        with contextlib.suppress(FileNotFoundError):  # removed since it was listed
            found.append((name, os.stat(name, dir_fd=directory, follow_symlinks=False)))
    return found


def _tree(top: int, unread: list[tuple[str, str]]) -> Iterator[tuple[str, int, Listed]]:
    """Each directory below the one open as `top`, top-down in name order, as (its path relative to
    `top`, a descriptor on it valid until the next step, its names with their lstat). Each is
    reached from `top` one O_NOFOLLOW component at a time and each name looked at through that
    descriptor, so a directory another user swaps for a link meanwhile (a restored copy may carry
    0o777 ones) is refused, never read through by a root `run` to upload what it leads to. A
    stack, where os.walk recursed once per level: a copy 1,100 levels deep made every later
    measure or pack of it raise RecursionError. A directory that cannot be opened or listed is
    added to `unread` as (its path, why); a name that is not UTF-8 (never carried) is not entered."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            fd = open_beneath(top, rel.split("/") if rel else [])
        except OSError as exc:
            unread.append((rel or ".", exc.strerror or str(exc)))
            continue
        try:
            try:
                listed = _listed(fd)
            except OSError as exc:
                unread.append((rel or ".", exc.strerror or str(exc)))
                continue
            yield rel, fd, listed  # what the caller raises meanwhile is its own: not caught here
        finally:
            os.close(fd)
        dirs = [name for name, st in listed if stat.S_ISDIR(st.st_mode) and _utf8(name)]
        stack.extend(f"{rel}/{name}" if rel else name for name in reversed(dirs))


def _utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


# Where each --carry root stood when CMD started, by the name the manifest gives it.
Seen = dict[str, Place]


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_uid


def _holder(path: str) -> int:
    """A descriptor on the directory holding the root at `path`, reached one component at a time,
    a link on the way followed only when this user or root made it where no other user may change
    it (files.open_user_dir): a directory above the root that another user swaps for a link to
    root's never has a root `run` measure or upload what the link leads to. The root's own name is
    then looked at through this descriptor, never followed."""
    return open_user_dir(os.path.dirname(path))[0]


def _why(exc: OSError) -> str:
    return f"{shown_root(str(exc.filename))}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)


def measure(names: list[str], cwd: str, session_id: str, after: str,
            start: Seen | None = None) -> tuple[dict[str, int | None], Seen]:
    """Bytes of regular files under each named root here (None for one absent), and where each
    stands (none for a root whose directory is missing), each reached through the directory
    holding it (_holder) and looked at there without following a link. Raises INVALID_ARGUMENT,
    its message ending with `after`, for a root that is a link or a device, or whose directory is
    reached through a link another user made or could swap; and CARRY_FAILED for one not where,
    or not what, it was in `start` (_moved)."""
    sizes: dict[str, int | None] = {}
    seen: Seen = {}
    for name in names:
        path = _where(name, cwd)
        sizes[name] = None
        try:
            holder = _holder(path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # its directory is missing: check_at_start says so
        except OSError as exc:
            raise ClientError(Reason.INVALID_ARGUMENT, f"--carry {shown_root(name)}: its directory cannot be "
                              f"used ({_why(exc)}); {after}", session_id) from None
        try:
            sizes[name], seen[name] = _measured(name, holder, os.path.basename(path), after, session_id)
            first = (start or {}).get(name)
            why = None if first is None else _moved(first, holder, os.path.dirname(path), seen[name].root)
            if why is not None:
                raise failed(f"--carry {shown_root(name)}: {why}; {after}", session_id)
        finally:
            os.close(holder)
    return sizes, seen


def _measured(name: str, holder: int, base: str, after: str, session_id: str) -> tuple[int | None, Place]:
    """The size and place of root `name`, `base` in the directory open as `holder`."""
    directory = _identity(os.fstat(holder))
    try:
        st = os.stat(base, dir_fd=holder, follow_symlinks=False)
    except FileNotFoundError:
        return None, Place(directory, None)
    if stat.S_ISREG(st.st_mode):
        return st.st_size, Place(directory, _identity(st))
    if not stat.S_ISDIR(st.st_mode):
        # Refused here, at the start, not only when the owner's upload would meet it at the end.
        raise ClientError(Reason.INVALID_ARGUMENT, f"--carry {shown_root(name)}: {NOT_A_ROOT}; {after}",
                          session_id)
    total = 0
    with contextlib.suppress(OSError):  # an unreadable root measures what could be read
        top = os.open(base, OPEN_DIR, dir_fd=holder)
        try:
            st = os.fstat(top)  # the directory measured, should another have been renamed in meanwhile
            for _, _, listed in _tree(top, []):
                total += sum(s.st_size for _, s in listed if stat.S_ISREG(s.st_mode))
        finally:
            os.close(top)
    return total, Place(directory, _identity(st))


class Entry(NamedTuple):
    """One entry of a directory root, as packed: a file's bytes are read as the walk meets it."""

    path: str
    kind: str
    mode: int
    target: str = ""  # a link's
    data: bytes = b""  # a file's


# Reads a regular file as (its name in the directory open as the int, as said to a person, its lstat).
Reader = Callable[[str, str, os.stat_result, int], tuple[bytes, os.stat_result]]


def _names_open(fd: int, where: str) -> str | None:
    """Why another user may make a name in the directory open as `fd`, called `where`
    (carry_rules.names_open_because)."""
    return names_open_because(os.fstat(fd).st_mode, swappable_because(fd, where))


def _check(kind: str, st: os.stat_result, root: str, names_open: str | None = None, shown: str = "") -> None:
    """Raises CarryRefused, naming `shown` (if given) and why, for an entry of the root `root` as
    carry_rules.not_carried_because refuses it: another user's, or a directory they may make names in."""
    why = not_carried_because(kind, st.st_uid, os.geteuid(), names_open, root)
    if why is not None:
        raise CarryRefused(f"{shown}: {why}" if shown else why)


def _links_protected() -> bool:
    """Whether this host's kernel protects hard links (carry_rules.hardlinks_protected); a sysctl
    that cannot be read is taken as unprotected."""
    try:
        with open(PROTECTED_HARDLINKS, encoding="ascii") as sysctl:
            return hardlinks_protected(sysctl.read(16))
    except (OSError, ValueError):
        return hardlinks_protected(None)


def _check_names(files: list[tuple[str, os.stat_result]], links_protected: bool) -> None:
    """Raises CarryRefused, naming the first of `files` (each as said to a person, with its fstat)
    that has names outside them where hard links are not protected
    (carry_rules.linked_outside_because): each (st_dev, st_ino) is counted once per name it has
    among `files`, all of one root."""
    inside = Counter((st.st_dev, st.st_ino) for _, st in files)
    for shown, st in files:
        if (why := linked_outside_because(st.st_nlink, inside[st.st_dev, st.st_ino],
                                          links_protected)) is not None:
            raise CarryRefused(f"{shown}: {why}" if shown else why)


def _walk_root(top: int, name: str, read: Reader, links_protected: bool) -> tuple[list[Entry], list[str]]:
    """A directory root's entries below it (open as `top`) in walk order, each parent before its
    children, files read with `read` as they are met; and what is left out, with why. Each name is
    said as shown_root says it: the tree may be a copy another user uploaded, and a name holding a
    line break or an escape sequence, printed as it is, faked holdfast's lines or drove the terminal.
    Raises CarryRefused for the first entry carry_rules.not_carried_because refuses — the root
    itself included, each directory judged through its descriptor before anything in it — as
    another user's or one they may have put there, and then for a file with a name outside the
    root (_check_names; one in a directory not read, or not UTF-8, counts as outside): the whole
    copy is refused."""
    entries: list[Entry] = []
    files: list[tuple[str, os.stat_result]] = []
    root = shown_root(name)
    skipped: list[str] = []
    unread: list[tuple[str, str]] = []
    for where, fd, listed in _tree(top, unread):
        here = os.path.join(name, where) if where else name
        _check("dir", os.fstat(fd), root, _names_open(fd, here), shown_root(here) if where else "")
        for entry, s in listed:
            rel = f"{where}/{entry}" if where else entry
            shown = shown_root(os.path.join(name, rel))
            if not _utf8(rel):
                skipped.append(f"{shown}: its name is not UTF-8; not carried")
            elif stat.S_ISDIR(s.st_mode):
                _check("dir", s, root, shown=shown)  # who may make names in it: judged when it is entered
                entries.append(Entry(rel, "dir", stat.S_IMODE(s.st_mode) & 0o777))
            elif stat.S_ISREG(s.st_mode):
                _check("file", s, root, shown=shown)  # its names: judged once the walk has counted them
                data, st = read(entry, shown, s, fd)
                files.append((shown, st))
                entries.append(Entry(rel, "file", stat.S_IMODE(st.st_mode) & 0o777, data=data))
            elif stat.S_ISLNK(s.st_mode):
                _check("symlink", s, root, shown=shown)
                target = os.readlink(entry, dir_fd=fd)
                if not _utf8(target):  # a manifest holds UTF-8 only: it would not encode
                    skipped.append(f"{shown}: its link's target is not UTF-8; not carried")
                    continue
                try:
                    check_entry(rel, "symlink", 0o777, target)
                except CarryRefused as exc:
                    skipped.append(f"{shown}: {exc}")
                    continue
                entries.append(Entry(rel, "symlink", 0o777, target))
            else:
                skipped.append(f"{shown}: not a file, directory or symlink; not carried")
    skipped += [f"{shown_root(os.path.join(name, what))}: its contents could not be read ({why}); not "
                "carried" for what, why in unread]
    _check_names(files, links_protected)
    # A link that leaves the directory once the tree's other links are followed is left out; each
    # one left out changes where others lead, so this repeats until none leaves.
    while escaping := escaping_links({e.path: e.target for e in entries if e.kind == "symlink"}):
        skipped += [f"{shown_root(os.path.join(name, p))}: its link leads outside the carried directory; "
                    "not carried" for p in escaping]
        entries = [e for e in entries if e.path not in escaping]
    return entries, skipped


def _moved(start: Place, holder: int, where: str, now: Identity | None) -> str | None:
    """Why the root found as `now` (None: absent) in the directory open as `holder` (called
    `where`) is not one the run may take for the root it started with (carry_rules.moved_because);
    who else may change that directory is judged only when it or the root is another than at the
    start (a walk up to /)."""
    directory = _identity(os.fstat(holder))
    swappable = None
    if (directory, now) != start:
        try:
            check_ancestors(holder, where)
        except OSError as exc:  # Swappable, or UnknownOwner: who may change it cannot be told
            swappable = _why(exc)
    return moved_because(start, directory, now, swappable, os.geteuid())


@dataclass
class _Packing:
    """A copy being packed: its manifest, its files' bytes in manifest order, what is left out; and
    the per-session cap, with the bytes read so far against it."""

    manifest: pb.CarryManifest
    cap: int
    links_protected: bool  # fs.protected_hardlinks, read once a pack (_links_protected)
    stream: list[bytes] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    size: int = 0

    def read(self, path: str, shown: str, listed: os.stat_result,
             directory: int | None = None) -> tuple[bytes, os.stat_result]:
        """A regular file's bytes (_read_whole), refused CARRY_TOO_LARGE before they are read once
        its size — as listed, then as opened — takes the copy past the cap: no more than the cap is
        ever read, however large a file says it is."""
        try:
            data, st = _read_whole(path, shown, listed, directory, self.cap - self.size)
        except _Oversize as over:
            what = f"the carried state, up to and with {shown} ({over.size} bytes),"
            raise ClientError(Reason.CARRY_TOO_LARGE, f"{over_cap(what, self.size + over.size, self.cap)}; "
                              "nothing was uploaded", self.manifest.session_id) from None
        self.size += len(data)
        return data, st

    def add(self, root: int, entry: Entry) -> None:
        if entry.kind == "file":
            self.manifest.entries.add(root=root, path=entry.path, kind="file", mode=entry.mode,
                                      size=len(entry.data), sha256=hashlib.sha256(entry.data).hexdigest())
            self.stream.append(entry.data)
        else:
            self.manifest.entries.add(root=root, path=entry.path, kind=entry.kind, mode=entry.mode,
                                      link_target=entry.target)

    def root(self, name: str, cwd: str, seen: Seen | None) -> None:
        """Root `name` and everything below it, reached through the directory holding it (_holder)
        and opened there without following a link. With `seen` (where the roots stood when CMD
        started), one whose directory, or which itself, is another than the run started with, where
        another user may have put it there (_moved), is refused, nothing of the copy uploaded; one
        absent then is carried only if CMD made a plain file or directory there, and left out, with
        why, otherwise."""
        session_id, shown = self.manifest.session_id, shown_root(name)
        path = _where(name, cwd)
        base = os.path.basename(path)
        start = None if seen is None else seen.get(name)
        absent = seen is not None and (start is None or start.root is None)

        def fail(why: str) -> ClientError:
            return failed(f"--carry {shown}: {why}; nothing of this copy was kept (the last good copy "
                          "stands)", session_id)

        def refused(why: str) -> None:
            if not absent:
                raise fail(why)
            self.skipped.append(f"--carry {shown}: {why}; not carried")

        try:
            holder = _holder(path)
        except OSError as exc:
            refused(f"its directory cannot be opened ({_why(exc)})")
            return
        index = len(self.manifest.roots)
        try:
            try:
                st = os.stat(base, dir_fd=holder, follow_symlinks=False)
            except FileNotFoundError:
                if absent:
                    self.skipped.append(f"--carry {shown}: CMD did not create it; not carried")
                    return
                raise failed(f"--carry {shown}: no such file or directory here (in {shown_root(cwd)})",
                             session_id) from None
            # Refused, never left out, even for a root absent at the start: what another user may
            # have put at its name is said as such, and the last good copy stands.
            if start is not None and (why := _moved(start, holder, os.path.dirname(path),
                                                    _identity(st))) is not None:
                raise fail(why)
            why = (None if start is not None or seen is None
                   else "its directory did not exist when the run started")
            if why is None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                why = NOT_A_ROOT
            if why is not None:
                refused(why)
                return
            if stat.S_ISREG(st.st_mode):
                try:
                    _check("file", st, shown)
                    _check_names([("", st)], self.links_protected)  # any other name is outside the root
                except CarryRefused as exc:
                    raise fail(str(exc)) from None
                self.manifest.roots.add(path=name, kind="file")
                data, st = self.read(base, shown, st, holder)  # open_listed: that very file, or refused
                self.add(index, Entry("", "file", stat.S_IMODE(st.st_mode) & 0o777, data=data))
                return
            top = os.open(base, OPEN_DIR, dir_fd=holder)  # the root itself swapped for a link is refused
            if _identity(os.fstat(top)) != _identity(st):
                os.close(top)
                raise failed(f"--carry {shown} was replaced by another directory while it was read; nothing "
                             "of this copy was kept (the last good copy stands)", session_id)
        finally:
            os.close(holder)
        self.manifest.roots.add(path=name, kind="dir")
        self.add(index, Entry("", "dir", stat.S_IMODE(st.st_mode) & 0o777))
        try:
            entries, left_out = _walk_root(top, name, self.read, self.links_protected)
        except CarryRefused as exc:
            raise fail(str(exc)) from None
        finally:
            os.close(top)
        self.skipped += left_out
        for entry in entries:
            self.add(index, entry)

    def packed(self) -> Packed:
        """The copy, refused here as restore's rules and CommitCarry would refuse it, before
        anything is uploaded."""
        manifest, session_id = self.manifest, self.manifest.session_id
        data = b"".join(self.stream)
        chunks = chunked(data)
        manifest.total_bytes = len(data)
        manifest.chunk_sha256.extend(hashlib.sha256(c).hexdigest() for c in chunks)
        try:
            check_manifest(manifest)
        except CarryRefused as exc:
            raise failed(f"the carried state cannot be carried: {exc}; nothing was uploaded",
                         session_id) from None
        # Checked here, measured as CommitCarry measures it (the JSON etcd stores: coordinator/protojson
        # writes exactly this), so a copy it would refuse is not uploaded whole first. Imported here:
        # packing happens after CMD, and `run`'s path to CMD stays without json_format.
        from google.protobuf import json_format

        size = len(json_format.MessageToJson(manifest, indent=None, sort_keys=True).encode())
        if size + UPLOAD_FIELDS_BYTES > MANIFEST_BYTES:
            raise ClientError(
                Reason.CARRY_TOO_LARGE,
                f"the carried state's manifest ({len(manifest.entries)} entries) is {size} bytes; the "
                f"coordinator takes at most {MANIFEST_BYTES - UPLOAD_FIELDS_BYTES} (fewer files or shorter "
                "names); nothing was uploaded",
                session_id,
            )
        return Packed(manifest, chunks, self.skipped)


def pack(names: list[str], cwd: str, session_id: str, seen: Seen | None = None,
         cap: int = MAX_SESSION_CAP) -> Packed:
    """The named roots as one copy: files in walk order, a stream cut into chunks; a copy the
    rules of restore would refuse is refused here, before anything is uploaded, and one over the
    per-session `cap` (the coordinator's, as GetCarry said it) before more than `cap` bytes are read
    (CARRY_TOO_LARGE). Each root is reached through the directory holding it, never through a link
    another user made or could swap (_holder); with `seen`, where the roots stood when CMD started,
    one that is not where and what it was is refused, and one absent then carried only if CMD made
    it (_Packing.root)."""
    packing = _Packing(pb.CarryManifest(session_id=session_id), cap, _links_protected())
    try:
        for name in names:
            packing.root(name, cwd, seen)
    except OSError as exc:
        # A file CMD removes while a checkpoint reads it: the owner catches ClientError only, so an
        # OSError here ended its checkpoints, or its release.
        raise failed(
            f"{shown_root(str(exc.filename or ', '.join(names)))}: {exc.strerror}; nothing of this copy was "
            "kept (the last good copy stands)",
            session_id,
        ) from None
    return packing.packed()


async def upload(client: Client, grant: Grant, packed: Packed, reason: str) -> int:
    """Begin, every chunk, commit — each under the grant; the manifest's revision."""
    slot = await client.begin_carry(grant, packed.manifest.total_bytes, len(packed.chunks))
    for index, chunk in enumerate(packed.chunks):
        await client.put_carry_chunk(grant, slot, index, chunk)
    manifest = pb.CarryManifest()
    manifest.CopyFrom(packed.manifest)
    manifest.fence, manifest.slot, manifest.host_id, manifest.reason = (
        grant.fence,
        slot,
        client.host_id,
        reason,
    )
    return await client.commit_carry(grant, manifest)


# --- restore -------------------------------------------------------------------------------------
async def download(client: Client, grant: Grant) -> tuple[pb.CarryManifest, bytes] | None:
    """The session's last committed copy, every chunk checked against the manifest; None if none."""
    session_id = grant.session_id
    first = await client.get_carry(session_id)
    if not first.found:
        return None
    manifest = first.manifest
    parts = []
    for index, want in enumerate(manifest.chunk_sha256):
        got = await client.get_carry_chunk(grant, manifest.slot, index)
        if (got.manifest.fence, got.manifest.written_at_unix_ms) != (
            manifest.fence,
            manifest.written_at_unix_ms,
        ):
            raise failed("the session's carried state was replaced while it was read; retry", session_id)
        if hashlib.sha256(got.chunk).hexdigest() != want:
            raise failed(
                f"chunk {index} of the carried state does not match its sha256: the copy is corrupt; "
                "nothing was restored",
                session_id,
            )
        parts.append(got.chunk)
    data = b"".join(parts)
    if len(data) != manifest.total_bytes:
        raise failed(
            f"the carried state holds {len(data)} bytes, its manifest says {manifest.total_bytes}; "
            "nothing was restored",
            session_id,
        )
    return manifest, data


# --- a run's carried state: checked at its start, restored between commit and exec ----------------
async def check_at_start(
    client: Client, session_id: str, paths: list[str], cwd: str, made: Collection[str] = ()
) -> tuple[list[str], int, Seen]:
    """The --carry roots as the manifest names them, the coordinator's per-session cap, and where
    the roots not in the session's last copy stand now (measure), checked before anything is
    asked of the session's owner: each root's directory exists — or is one of `made`, the
    directories (normalised paths) the run makes once granted, before the restore (RunSpec.
    made_at_grant) — is reached through no link another user made or could swap, and what this run
    would carry (the copy's roots restored, the rest as they are here) fits the cap. Raises
    INVALID_ARGUMENT or CARRY_TOO_LARGE."""
    try:
        names = list(dict.fromkeys(root_name(path) for path in paths))
    except CarryRefused as exc:
        raise ClientError(Reason.INVALID_ARGUMENT, str(exc), session_id) from None
    if not names:
        return [], 0, {}
    carried = await client.get_carry(session_id)
    in_copy = {path: size for path, _, size in root_sizes(carried.manifest)} if carried.found else {}
    names = as_the_copy_names(names, list(in_copy), cwd)
    here, seen = await asyncio.to_thread(measure, [n for n in names if n not in in_copy], cwd, session_id,
                                         "nothing was asked of the session's owner")
    missing = (n for n in here if n not in seen)  # its directory: missing, or not a directory
    for name in (n for n in missing if os.path.normpath(os.path.dirname(_where(n, cwd))) not in made):
        raise ClientError(
            Reason.INVALID_ARGUMENT,
            f"--carry {shown_root(name)}: no such file or directory here, nor in the session's copy, and "
            f"its directory {shown_root(os.path.dirname(_where(name, cwd)))} cannot be used (it does not "
            "exist, or is not a directory); create it first. Nothing was asked of the session's owner",
            session_id,
        )
    total = sum(in_copy.get(n, 0) for n in names) + sum(size or 0 for size in here.values())
    try:
        check_cap(total, carried.session_cap_bytes)
    except CarryRefused as exc:
        raise ClientError(
            Reason.CARRY_TOO_LARGE, f"{exc}; nothing was asked of the session's owner", session_id
        ) from None
    return names, carried.session_cap_bytes, seen


async def restore_before_exec(client: Client, grant: Grant, names: list[str], cwd: str, cap: int,
                              say: Callable[[str], None], start: Seen) -> Seen:
    """Between commit and exec: the session's last copy of the named roots put in place, then what
    CMD would start with checked against the cap once more (the copy may have changed since), and
    where each root stands now, which its uploads will require (pack). A root check_at_start saw
    (`start`) must still be in that directory and, unless restored, as _moved judges it then
    (CARRY_FAILED, CMD does not run)."""
    session_id = grant.session_id
    found = await download(client, grant)
    if found is None:
        say(f"no carried state for {session_id} yet: CMD starts with {', '.join(map(shown_root, names))} "
            "as here")
    else:
        for line in await asyncio.to_thread(restore, *found, names, cwd):
            say(line)
    restored = {root.path for root in found[0].roots} if found else set()
    before = {name: place._replace(root=None) if name in restored else place for name, place in start.items()}
    sizes, seen = await asyncio.to_thread(measure, names, cwd, session_id, "CMD did not run", before)
    for name in (n for n, size in sizes.items() if size is None):
        say(f"--carry {shown_root(name)}: neither here nor in the session's copy; CMD starts without it")
    try:
        check_cap(sum(size or 0 for size in sizes.values()), cap)
    except CarryRefused as exc:
        raise ClientError(Reason.CARRY_TOO_LARGE, f"{exc}; CMD did not run", session_id) from None
    return seen
