"""Where a running `holdfast up` tells the CLI what it serves: `up.json` in its state directory.

The state directory is `--state-dir`, else $HOLDFAST_STATE_DIR, else one fixed place per user
($XDG_STATE_HOME/holdfast, by default ~/.local/state/holdfast), so `holdfast status` or `holdfast
exec` finds the stack from any working directory. The file is written whole (by rename) once
every part is up, and removed when `up` stops; the client reads it only to find the certificates
of `up --tls` for the address it dials — through the default state directory, or, for an `up
--state-dir X`, through the word `point` leaves in the default one's `addresses/` for its
address. Both `up` and the client library use this module, so neither imports the other.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from holdfast.common import files

STATE_FILE = "up.json"
DEFAULT_COORDINATOR = "127.0.0.1:7420"  # where `holdfast up` listens unless told otherwise
STATE_DIR_ENV = "HOLDFAST_STATE_DIR"
ADDRESSES_DIR = "addresses"  # in the default state directory: which state directory serves an address


class NoStack(Exception):
    """No running `holdfast up` publishes its state there."""


def default_state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "holdfast"


def read_json(directory: int | None, name: str | Path) -> Any:
    """The JSON of `name` (in the directory open as `directory`, if given), a regular file read
    never through a link nor waiting on a FIFO: OSError otherwise."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(name))
        return json.loads(f.read())


def load(state_dir: Path, directory: int | None = None) -> dict[str, Any]:
    """The state `up` left in `state_dir` (read through `directory`, its open descriptor, if given)."""
    try:
        state = read_json(directory, STATE_FILE if directory is not None else state_dir / STATE_FILE)
    except (OSError, ValueError):
        raise NoStack(f"no running `holdfast up` with state in {state_dir}. Next: start one with "
                      f"`holdfast up --hosts N --state-dir {state_dir}`") from None
    if not isinstance(state, dict):
        raise NoStack(f"{state_dir / STATE_FILE} is not the state of a `holdfast up`")
    return state


def load_private(state_dir: Path) -> dict[str, Any]:
    """`load`, of a state directory only this user may have written: what another user left in one
    of theirs (a pid to enter, certificates to trust) is no stack of ours."""
    try:
        directory = files.open_private_dir(state_dir)
    except OSError:
        raise NoStack(f"no `holdfast up` of uid {os.geteuid()} with state in {state_dir} (it is not a "
                      "directory of this user's that only it may write)") from None
    try:
        return load(state_dir, directory)
    finally:
        os.close(directory)


def write(directory: int | Path, state: dict[str, Any]) -> None:
    """up.json, in the state directory `directory` (a path, or open as a descriptor)."""
    files.write_whole(directory, STATE_FILE, json.dumps(state, indent=2).encode(), mode=0o644)


def remove(directory: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(STATE_FILE, dir_fd=directory)


def _pointer(address: str) -> Path:
    name = "".join(c if c.isalnum() or c in ".-" else "_" for c in address)
    return default_state_dir() / ADDRESSES_DIR / f"{name}.json"


def _said(directory: int | None, name: str | Path) -> Path | None:
    """The state directory the word `name` (in the directory open as `directory`, if given) names."""
    try:
        found = read_json(directory, name).get("state_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(found) if isinstance(found, str) and found else None


def pointed(address: str) -> Path | None:
    """The state directory `point` last named for `address`, if any."""
    return _said(None, _pointer(address))


def point(state_dir: Path, address: str) -> None:
    """Tells the CLI, from any directory, that the `up` with state in `state_dir` serves `address`:
    a state directory other than the default (`up --state-dir X`) is otherwise unknown to it."""
    pointer = _pointer(address)
    said = json.dumps({"state_dir": str(state_dir.resolve())}).encode()
    # Both this user's alone: a default state directory another user made (or may write, or may
    # swap: root with another user's HOME) gets no word of ours, no directory is made in theirs,
    # and nothing is written through a link there.
    top = files.open_private_path(default_state_dir())
    try:
        where = files.open_private_dir(ADDRESSES_DIR, make=True, dir_fd=top)
    finally:
        os.close(top)
    try:
        files.write_whole(where, pointer.name, said, mode=0o644)
    finally:
        os.close(where)


def unpoint(state_dir: Path, address: str) -> None:
    """Removes `point`'s word for `address` while it still names `state_dir`: by its name through
    descriptors on the default state directory and its `addresses/`, only while both are this
    user's alone — never by a path through a link another user put there (root with their HOME)."""
    name = _pointer(address).name
    try:
        top = files.open_private_dir(default_state_dir())
        try:
            where = files.open_private_dir(ADDRESSES_DIR, dir_fd=top)
        finally:
            os.close(top)
    except OSError:
        return  # not ours: no word of ours is there
    try:
        if _said(where, name) == state_dir.resolve():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=where)
    finally:
        os.close(where)


def tls_dir_for(address: str) -> Path | None:
    """The certificates of the `holdfast up --tls` serving `address`: the one with state in the
    default state directory, or the one `point` named for the address."""
    for state_dir in (default_state_dir(), pointed(address)):
        try:
            state = load_private(state_dir) if state_dir is not None else {}
        except NoStack:
            continue
        if state.get("coordinator") == address and state.get("tls_dir"):
            return Path(state["tls_dir"])
    return None
