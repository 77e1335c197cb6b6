"""The pure rules of carried state (`run --carry`, docs/carry.md): which manifests a restore may
write, how carried paths are named, the per-session cap. The coordinator applies `check_manifest`
at CommitCarry and every restoring client applies it again, so a hostile copy is refused when it
is uploaded and, should one be stored anyway, when it is restored.

Guarantee: a manifest `check_manifest` accepts describes, for each root, a tree that lies wholly
beneath that root once built: every entry path is relative and normalised (no `..`, `.`, empty
segment or NUL), named once, and its parent is a directory entry declared before it — so no entry
lies beneath a carried symlink; files and directories carry permission bits only; every symlink's
target is relative and, resolved the way the kernel would resolve it in that very tree (each of
the tree's own links followed, at most MAX_LINK_HOPS of them), never leaves the root. A component
the tree does not hold is taken as a plain directory, as it would be if CMD later made one.
`moved_because` lets a root be uploaded as another file or directory than at the run's start, or
from another directory than the one (device and inode) that held it then — a root absent then and
present now, or deleted and made again, included — only where no other user may have put it
there: no other user may change its directory or any above it, and the root is the running
user's own. `not_carried_because` lets an upload carry an entry — a root, or anything below a
directory root — only when it is the running user's (or, for a run not as root, root's), and no
directory in the root is one another user may make names in; `linked_outside_because` a regular
file only when all its names are in the root, where hard links are not protected
(`hardlinks_protected`). No I/O here.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from holdfast.common.identifiers import HOST_ID
from holdfast.common.link_rules import MAX_LINK_HOPS, LinkEnds
from holdfast.v1 import coordinator_pb2 as pb

CHUNK_BYTES = 512 * 1024  # each chunk is one request, far below etcd's 1.5 MiB
# The largest per-session cap a coordinator takes (64 chunks: a commit compares each, and etcd
# allows 128 operations a transaction), and the setting that sets it.
MAX_SESSION_CAP = 32 << 20
CAP_SETTING = "carry_session_cap_bytes"
KINDS = ("file", "dir", "symlink")
MAX_ENTRIES = 10_000
# The manifest as the coordinator stores it (its protobuf JSON) and a commit's compares (at most 68
# keys) share one etcd request of 1.5 MiB (coordinator.records.ETCD_REQUEST_LIMIT_BYTES); MAX_ENTRIES
# files with short names take about 1.4 MB of it.
MANIFEST_BYTES = 1536 * 1024 - 32 * 1024
UPLOAD_FIELDS_BYTES = 1024  # what an upload adds to a packed manifest: fence, slot, host id, reason
NAME_MAX = 255      # bytes in one path component, as the kernel allows
PATH_MAX = 4096     # bytes in a path; a link target is shorter (symlink(2) counts its NUL)
SHA256 = re.compile(r"[0-9a-f]{64}")
REASONS = ("", "release", "handoff", "checkpoint")  # why a copy was uploaded ("" while packed)


class CarryRefused(ValueError):
    """A path, an entry, a manifest or a size a carry must not take; the message says which and why."""


def root_name(path: str) -> str:
    """A `--carry PATH` as the manifest records it and a later run matches it: normalised, `~`
    expanded, relative paths kept relative (to run's working directory, on whichever host)."""
    if "\0" in path:
        raise CarryRefused(f"--carry {path[:256]!r}: a path holds no NUL byte")
    return _normal(os.path.expanduser(path), path)


def _normal(name: str, given: str) -> str:
    """`name` normalised; refused if it holds a NUL, is '.' or '/', or goes through '..'."""
    normal = os.path.normpath(name)
    if "\0" in name or normal in (".", "/") or normal.startswith("../") or normal == "..":
        raise CarryRefused(
            f"--carry {given[:256]!r}: name a file or directory below the working directory or by "
            "its absolute path (not '.', '/' or a path through '..'; no NUL)"
        )
    return normal


def _shown(path: str) -> str:
    return repr(path[:256]) if path else "(the carried root)"


def _check_path(path: str) -> list[str]:
    """The segments of an entry path; refuses one that is absolute, unnormalised or too long.
    The raw segments are judged, not a normalised path: "./x", "a//b" and "/x" name a file twice
    or leave the root, and are refused rather than silently made to fit."""
    parts = path.split("/")
    if (
        "\0" in path
        or len(path.encode()) > PATH_MAX
        or any(part in ("..", ".", "") or len(part.encode()) > NAME_MAX for part in parts)
    ):
        raise CarryRefused(
            f"carry entry {_shown(path)}: only relative, normalised paths (no '..', '.', empty "
            f"segment or NUL; at most {NAME_MAX} bytes a name, {PATH_MAX} a path) are restored"
        )
    return parts


def check_entry(path: str, kind: str, mode: int, link_target: str = "") -> None:
    """Raises CarryRefused for an entry no restore may write, judged alone. `path` "" is the root
    itself. Where a symlink's target leads is judged with the whole tree (`check_tree`)."""
    if path:
        _check_path(path)
    if kind not in KINDS:
        raise CarryRefused(
            f"carry entry {_shown(path)}: kind {kind[:16]!r} is not a file, directory or symlink "
            "(device files, FIFOs and sockets are never restored)"
        )
    if mode & ~0o777:
        raise CarryRefused(
            f"carry entry {_shown(path)}: mode {mode:o} has bits beyond rwx (setuid, setgid and "
            "sticky bits are never restored)"
        )
    if kind != "symlink":
        if link_target:
            raise CarryRefused(f"carry entry {_shown(path)}: a {kind} has no link target")
        return
    if not path:
        raise CarryRefused("a carried root is a file or a directory, not a symlink")
    # A name over NAME_MAX: the kernel fails its lookup (ENAMETOOLONG) where the rules would take it
    # as a directory CMD could make, so the walk on disk could not judge a copy the rules accepted.
    if not link_target or link_target.startswith("/") or "\0" in link_target or (
        len(link_target.encode()) >= PATH_MAX
    ) or any(len(part.encode()) > NAME_MAX for part in link_target.split("/")):
        raise CarryRefused(
            f"carry entry {_shown(path)}: symlink target {link_target[:256]!r} is empty, absolute, "
            f"holds a NUL, is over {PATH_MAX - 1} bytes or has a name over {NAME_MAX}"
        )


class _Trie:
    """A tree's links as a trie of path components (a node per distinct directory or link path)."""

    def __init__(self, links: Mapping[str, str]) -> None:
        self.parent: list[int | None] = [None]
        self.child: dict[tuple[int, str], int] = {}
        self.links: dict[int, str] = {}  # link node -> its target
        self.node: dict[str, int] = {}
        for path, target in links.items():
            node = 0
            for part in path.split("/"):
                if (node, part) not in self.child:
                    self.child[node, part] = len(self.parent)
                    self.parent.append(node)
                node = self.child[node, part]
            self.links[node] = target
            self.node[path] = node

    def up(self, here: int) -> int | None:
        return self.parent[here]

    def find(self, here: int, name: str) -> tuple[int, int | None] | None:
        node = self.child.get((here, name))
        return None if node is None else (node, node if node in self.links else None)

    def target(self, here: int, name: str) -> list[str]:
        return self.links[self.child[here, name]].split("/")


def escaping_links(links: Mapping[str, str]) -> list[str]:
    """The links of one tree (path -> target) whose target leaves the root, or loops, when
    followed in that tree the way the kernel would (link_rules.LinkEnds)."""
    tree = _Trie(links)
    ends = LinkEnds(tree)
    escaping = []
    for path, node in tree.node.items():
        parent = tree.parent[node]
        assert parent is not None  # a link is never the root
        if ends.resolve(parent, path.rsplit("/", 1)[-1], node) is None:
            escaping.append(path)
    return escaping


def check_tree(entries: Sequence[tuple[str, str, int, str]], root_kind: str) -> None:
    """One root's entries as (path, kind, mode, link target), in the manifest's order: the root
    entry first, each path once, each parent a directory declared before it, every link inside."""
    if root_kind not in ("file", "dir"):
        raise CarryRefused(f"a carried root is a file or a directory, not {root_kind[:16]!r}")
    if not entries or entries[0][:2] != ("", root_kind):
        raise CarryRefused(f"a carried {root_kind} starts with its own entry, path '' and kind {root_kind}")
    if root_kind == "file" and len(entries) != 1:
        raise CarryRefused("a carried file is one file entry")
    dirs = {""}
    seen: set[str] = set()
    links: dict[str, str] = {}
    for path, kind, mode, target in entries:
        check_entry(path, kind, mode, target)
        if path in seen:
            raise CarryRefused(f"carry entry {_shown(path)} is named twice")
        seen.add(path)
        if path and path.rpartition("/")[0] not in dirs:
            raise CarryRefused(
                f"carry entry {_shown(path)}: its parent is not a directory declared before it "
                "(nothing is restored beneath a link or a file)"
            )
        if kind == "dir":
            dirs.add(path)
        elif kind == "symlink":
            links[path] = target
    escaping = escaping_links(links)
    if escaping:
        raise CarryRefused(
            f"carry entry {_shown(escaping[0])}: its link {links[escaping[0]][:256]!r} leads outside "
            f"the carried directory, or through more than {MAX_LINK_HOPS} links, when followed"
        )


def _overlapping(names: Sequence[str]) -> tuple[str, str] | None:
    """Two roots of which one is the other or holds it; None if there are none. A trie of path
    components, so the cost is one step a component: comparing every root with every other took
    50 s of the coordinator's event loop for the 20,000 roots a manifest may name."""
    child: dict[tuple[int, str], int] = {}
    root_at: dict[int, str] = {}
    for name in sorted(names, key=lambda n: n.count("/")):  # each root after any that holds it
        node = 0
        for part in name.split("/"):
            node = child.setdefault((node, part), len(child) + 1)
            if node in root_at:
                return root_at[node], name
        root_at[node] = name
    return None


def check_manifest(manifest: pb.CarryManifest) -> None:
    """Every root and entry of a copy as a restore would write it; raises CarryRefused."""
    if len(manifest.entries) > MAX_ENTRIES:
        raise CarryRefused(
            f"the copy holds {len(manifest.entries)} entries; at most {MAX_ENTRIES} are carried"
        )
    # Printed to the next owner's terminal by its restore: a line break would fake a line of
    # holdfast's own, an escape sequence would drive the terminal.
    if manifest.reason not in REASONS or (manifest.host_id and not HOST_ID.fullmatch(manifest.host_id)):
        raise CarryRefused(
            f"the copy's host id {manifest.host_id[:64]!r} or reason {manifest.reason[:64]!r} is not one "
            f"holdfast writes (a reason is one of {', '.join(REASONS[1:])})"
        )
    names = [root.path for root in manifest.roots]
    for name in names:
        # Normalised, not expanded: expanding '~name' looks the user up, once a root.
        if _normal(name, name) != name:
            raise CarryRefused(f"carried root {name[:256]!r} is not written in its normalised form")
    overlap = _overlapping(names)
    if overlap:
        raise CarryRefused(f"carried roots {overlap[0]!r}, {overlap[1]!r} overlap: a root is carried once")
    trees: list[list[tuple[str, str, int, str]]] = [[] for _ in manifest.roots]
    files = 0
    for entry in manifest.entries:
        if entry.root >= len(trees):
            raise CarryRefused(
                f"carry entry {_shown(entry.path)} names root {entry.root}, which the copy lacks"
            )
        if entry.kind == "file":
            if not SHA256.fullmatch(entry.sha256):
                raise CarryRefused(f"carry entry {_shown(entry.path)}: its sha256 is not 64 hex digits")
            files += entry.size
        elif entry.size or entry.sha256:
            raise CarryRefused(f"carry entry {_shown(entry.path)}: a {entry.kind[:16]} has no bytes")
        trees[entry.root].append((entry.path, entry.kind, entry.mode, entry.link_target))
    for root, tree in zip(manifest.roots, trees, strict=True):
        try:
            check_tree(tree, root.kind)
        except CarryRefused as exc:
            raise CarryRefused(f"carried root {root.path[:256]!r}: {exc}") from None
    if files != manifest.total_bytes:
        raise CarryRefused(f"the copy's files hold {files} bytes; its manifest says {manifest.total_bytes}")


def as_the_copy_names(names: list[str], roots: list[str], cwd: str) -> list[str]:
    """Each --carry name as the session's copy spells a root that is the same path from `cwd`
    (`notes` and `/work/notes` in /work are one root), so a run names what the copy holds however
    it was typed; the copy's spelling, relative or absolute, is kept for its next upload too."""
    spelled = {os.path.normpath(os.path.join(cwd, root)): root for root in roots}
    return list(dict.fromkeys(spelled.get(os.path.normpath(os.path.join(cwd, n)), n) for n in names))


def check_cap(total_bytes: int, cap: int) -> None:
    if total_bytes > cap:
        raise CarryRefused(over_cap("the carried state", total_bytes, cap))


def over_cap(what: str, total_bytes: int, cap: int) -> str:
    """Why `what`, of `total_bytes`, is refused: the cap, the setting that sets it, what to do."""
    return (f"{what} is {total_bytes} bytes, over the coordinator's per-session cap of {cap} bytes "
            f"({CAP_SETTING}): carry less, or raise {CAP_SETTING}")


def restored_mode(mode: int) -> int:
    """The mode a carried file or directory is restored with: the copy's, less group and other
    write. The copy is another user's data: a root `run` restoring its 0777 directory or 0666 file
    as given let any local user edit root's files, or plant links where root's CMD writes."""
    return mode & 0o755


def chunked(stream: bytes) -> list[bytes]:
    return [stream[i : i + CHUNK_BYTES] for i in range(0, len(stream), CHUNK_BYTES)]


def root_sizes(manifest: pb.CarryManifest) -> list[tuple[str, int, int]]:
    """Each carried root with its files and bytes, in the manifest's order."""
    files = [0] * len(manifest.roots)
    size = [0] * len(manifest.roots)
    for entry in manifest.entries:
        if entry.kind == "file" and entry.root < len(manifest.roots):
            files[entry.root] += 1
            size[entry.root] += entry.size
    return [(root.path, files[i], size[i]) for i, root in enumerate(manifest.roots)]


# A file's (st_dev, st_ino, st_uid). The owner too: CMD deletes root's file, another user makes one
# at its name (a sticky directory lets them) and the kernel may give it the freed inode number.
Identity = tuple[int, int, int]


class Place(NamedTuple):
    """Where a --carry root stood when CMD started: the directory holding it and the root itself
    (None when it was absent), each by its Identity."""

    directory: Identity
    root: Identity | None


def moved_because(start: Place, directory: Identity, root: Identity | None, swappable: str | None,
                  euid: int) -> str | None:
    """Why the root found now (`root`, None when absent, in `directory`) is not one a `run` as
    `euid` may upload for the root it started with (`start`); None when it may.
    A root, or its directory, that is another than at the start — absent then and present now, or
    deleted and made again, included — is taken as CMD's own only when no other user may have put
    it there: none may change its directory or one above it (`swappable`: why one may, else None),
    and it is this user's. Otherwise another user renames one of root's files to its name in a
    directory they own (root's secret uploaded, for them to restore), or, where they may only
    create names (a sticky directory), makes it themselves (their content carried as root's). An
    unchanged root, and one absent now (nothing to upload) in an unchanged directory, are taken."""
    if directory != start.directory:
        what = "its directory is not the one it was when the run started"
    elif root is None or root == start.root:
        return None
    elif start.root is None:
        what = "it did not exist when the run started"
    else:
        what = "it is not the file or directory it was when the run started"
    if swappable is not None:
        return (f"{what}, and another user may change the directory holding it or one above it "
                f"({swappable}): they could have put it there")
    if root is not None and root[2] != euid:
        return f"{what}, and uid {root[2]} owns it, not uid {euid} that runs this: another user put it there"
    return None


def names_open_because(mode: int, swappable: str | None) -> str | None:
    """Why a user other than this one (or root) may make a name in a directory (its st_mode;
    `swappable`: why one may rename what is in it, files.swappable_because's answer); None when
    none may. A sticky directory others may write (/tmp's 1777) is open too: they cannot rename
    this user's entries there, but they make names in it, a hard link to this user's file among them."""
    if swappable is not None:
        return swappable
    if mode & stat.S_ISVTX and mode & 0o022:
        return f"it is sticky and others may write it (mode {stat.S_IMODE(mode):o}): they make names in it"
    return None


def not_carried_because(kind: str, uid: int, euid: int, names_open: str | None, root: str) -> str | None:
    """Why an entry met while packing the root `root` (as said to a person) as user `euid` — the
    root itself, or anything below a directory root: a `kind` ("file", "dir", "symlink") owned by
    `uid` — is not carried (the whole copy is then refused); None when it is. `names_open` is why
    another user may make a name (names_open_because) in the directory itself, for a directory;
    None otherwise.
    Each entry must be `euid`'s, or, for a run not as root, root's (trusted, as link and TLS rules
    trust it; its file is read as `euid`, so nothing `euid` cannot read is uploaded): another
    user's file, directory or link made in root's tree while CMD ran was uploaded and restored as
    root's (a CMD that drops privileges writes such files). No directory may be open to another
    user: they would put their files, or hard links to this user's, there. A hard link put there
    while it was open and left once it is closed is linked_outside_because's."""
    if uid != euid and (euid == 0 or uid != 0):
        chown = f"`chown -R {euid} {root}`" + ("" if euid == 0 else ", run as root,")
        return (f"uid {uid} owns it, not uid {euid} that runs this: another user's {kind} would be carried, "
                f"and restored, as yours ({chown} makes the files yours)")
    if kind == "dir" and names_open is not None:
        return (f"another user may make names in it ({names_open}): their files, or hard links to yours, "
                "would be carried as yours")
    return None


def hardlinks_protected(setting: str | None) -> bool:
    """Whether the kernel protects hard links, from fs.protected_hardlinks as read (None: it could
    not be read). Only "1" protects: then a user may link only a file they own or may both read and
    write, so a link another user made into a root is to a file that leaks nothing to them (their
    own files are refused by owner). Anything else, or nothing read, is taken as unprotected: a
    sysctl this process cannot see is no proof that others cannot link root's secret."""
    return setting is not None and setting.strip() == "1"


def linked_outside_because(nlink: int, inside: int, links_protected: bool) -> str | None:
    """Why a regular file in a root, with `nlink` names of which `inside` are in the root (1 for a
    file root: its other names are outside it), is not carried (the whole copy is then refused);
    None when it is. A name outside the root is one no judgement of the root's directories covers:
    where hard links are not protected (`links_protected` False: hardlinks_protected), another
    user, while they could make names in a directory of the root, linked a file of this user's from
    elsewhere into it — root's secret — and the link stays once the directory is closed (`chmod
    go-w`), uploaded for them to restore. Where they are protected no other user may have linked in
    a file they could not read and write already, and names outside are carried: a local `git
    clone`, a uv, conda or pnpm install hard-link from elsewhere. CMD's own links within the root are
    carried."""
    if links_protected or nlink <= inside:
        return None
    return (f"it has {nlink} names (hard-linked), {nlink - inside} outside the carried root, and hard links "
            "are not protected on this host (fs.protected_hardlinks is not 1): it may be a file from "
            "elsewhere that another user linked in, whatever the directory modes are now (remove that name; "
            "a file linked in on purpose: carry a copy of it instead, or set fs.protected_hardlinks = 1)")


def shown_root(path: str) -> str:
    """A root's name as said to a person: the uploader's text, quoted unless every character prints
    (an escape sequence would drive the reader's terminal, a line break fake a line of holdfast's)."""
    return path if path.isprintable() else repr(path)


def describe(manifest: pb.CarryManifest, path: str, files: int, size: int, now_unix_s: float) -> str:
    """One root of a copy as a person reads it: what, written by which grant where, and how old."""
    age = age_text(max(now_unix_s - manifest.written_at_unix_ms / 1000, 0))
    return (
        f"{shown_root(path)} ({files} files, {size} bytes) carried at fence {manifest.fence} from host "
        f"{manifest.host_id or '?'} on {manifest.reason or 'upload'}, {age} old"
    )


def age_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
