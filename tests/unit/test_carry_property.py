"""Generated manifests of files, directories and links, restored on disk: a restore refuses exactly
when an oracle of the rules written here (not imported from holdfast) says the manifest is invalid,
and otherwise makes exactly the manifest beneath its root; either way nothing outside the root
changes. The coordinator's check (the same `check_manifest`) gives the same verdict."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from holdfast.client.carry_restore import restore
from holdfast.client.errors import ClientError
from holdfast.common.carry_rules import CarryRefused, check_manifest
from holdfast.v1 import coordinator_pb2 as pb

HOPS = 40  # links the kernel follows in one lookup before ELOOP


# --- the oracle ----------------------------------------------------------------------------------
def stays_inside(links: dict[str, str], link: str) -> bool:
    """Follows `link` the way the kernel walks a path: a queue of components, a link's target
    pushed in front of what remains; False on climbing above the root or following over HOPS."""
    where = link.split("/")[:-1]
    todo = deque(links[link].split("/"))
    hops = 1
    while todo:
        name = todo.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            if not where:
                return False
            where.pop()
            continue
        full = "/".join([*where, name])
        if full in links:
            hops += 1
            if hops > HOPS:
                return False
            todo.extendleft(reversed(links[full].split("/")))
        else:
            where.append(name)
    return True


def oracle_valid(entries: list[tuple[str, str, str]]) -> bool:
    made = {"": "dir"}
    for path, kind, target in entries:
        parts = path.split("/")
        if path in made or any(p in ("", ".", "..") for p in parts):
            return False
        parent = "/".join(parts[:-1])
        if made.get(parent) != "dir":
            return False
        if kind == "symlink" and (not target or target.startswith("/")):
            return False
        made[path] = kind
    links = {path: target for path, kind, target in entries if kind == "symlink"}
    return all(stays_inside(links, link) for link in links)


# --- generated manifests -------------------------------------------------------------------------
good = st.sampled_from(list("abcdefst"))
names = st.sampled_from([*"abcdefst", "..", ".", ""])
targets = st.tuples(
    st.sampled_from([""] * 12 + ["/"]),
    st.lists(st.sampled_from(["a", "b", "s", "..", "..", ".", ""]), min_size=1, max_size=5),
).map(lambda t: t[0] + "/".join(t[1]))


@st.composite
def manifests(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """Mostly well-formed trees (each entry under a directory made before it), so many are valid
    and hold links worth following; now and then an entry anywhere, in any order."""
    dirs = [""]
    entries: list[tuple[str, str, str]] = []
    for index in range(draw(st.integers(0, 10))):
        if draw(st.integers(0, 9)) == 0:
            path = "/".join(draw(st.lists(names, min_size=1, max_size=3)))
        else:
            parent = draw(st.sampled_from(dirs))
            path = f"{parent}/{draw(good)}".lstrip("/")
            if any(path == e[0] for e in entries) and draw(st.integers(0, 9)):
                path = f"{parent}/n{index}".lstrip("/")  # mostly a fresh name, now and then the same twice
        kind = draw(st.sampled_from(["file", "dir", "dir", "symlink", "symlink"]))
        entries.append((path, kind, draw(targets) if kind == "symlink" else ""))
        if kind == "dir":
            dirs.append(path)
    return entries


def manifest_of(entries: list[tuple[str, str, str]]) -> tuple[pb.CarryManifest, bytes]:
    manifest = pb.CarryManifest(session_id="sess-prop", fence=1, written_at_unix_ms=1)
    manifest.roots.add(path="notes", kind="dir")
    manifest.entries.add(root=0, path="", kind="dir", mode=0o755)
    stream = b""
    for path, kind, target in entries:
        if kind == "file":
            body = path.encode()
            manifest.entries.add(root=0, path=path, kind="file", mode=0o640, size=len(body),
                                 sha256=hashlib.sha256(body).hexdigest())
            stream += body
        else:
            manifest.entries.add(root=0, path=path, kind=kind, mode=0o777 if target else 0o750,
                                 link_target=target)
    manifest.total_bytes = len(stream)
    return manifest, stream


def snapshot(top: Path, skip: Path | None = None) -> dict[str, object]:
    seen: dict[str, object] = {}
    for where, dirs, files in os.walk(top):
        if skip is not None and Path(where) == skip.parent:
            dirs[:] = [d for d in dirs if Path(where, d) != skip]
        for name in [*dirs, *files]:
            path = os.path.join(where, name)
            s = os.lstat(path)
            body = (os.readlink(path) if stat.S_ISLNK(s.st_mode)
                    else Path(path).read_bytes() if stat.S_ISREG(s.st_mode) else None)
            seen[os.path.relpath(path, top)] = (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), body)
    return seen


def expected(entries: list[tuple[str, str, str]]) -> dict[str, object]:
    kinds = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}
    modes = {"file": 0o640, "dir": 0o750, "symlink": 0o777}
    return {path: (kinds[kind], modes[kind], target or (path.encode() if kind == "file" else None))
            for path, kind, target in entries}


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_a_restore_refuses_exactly_what_the_oracle_refuses_and_never_touches_outside(
    entries: list[tuple[str, str, str]],
) -> None:
    manifest, stream = manifest_of(entries)
    valid = oracle_valid(entries)
    event(f"valid: {valid}, links: {sum(k == 'symlink' for _, k, _ in entries)}")
    try:
        check_manifest(manifest)
        checked = True
    except CarryRefused:
        checked = False
    assert checked == valid
    with tempfile.TemporaryDirectory() as scratch:
        box = Path(scratch)
        (box / "parent" / "notes").mkdir(parents=True)
        (box / "parent" / "notes" / "local").write_text("local")
        (box / "parent" / "sibling").mkdir()
        (box / "elsewhere").mkdir()
        outside = snapshot(box, skip=box / "parent" / "notes")
        local = snapshot(box / "parent" / "notes")
        if valid:
            restore(manifest, stream, ["notes"], str(box / "parent"))
            assert snapshot(box / "parent" / "notes") == expected(entries)
        else:
            with pytest.raises(ClientError, match="nothing was written"):
                restore(manifest, stream, ["notes"], str(box / "parent"))
            assert snapshot(box / "parent" / "notes") == local
        assert snapshot(box, skip=box / "parent" / "notes") == outside
