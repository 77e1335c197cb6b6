"""Hostile session trees, as a user's CMD might be: each a small sh script.

Every tree first takes an exclusive flock on LOCK on fd 9 (all descendants inherit that open file,
so the lock is held exactly while any process of the tree lives: the test's liveness oracle, read
without the code under test), writes `up` to the FIFO READY (the test waits on that write, not on
a timer), then behaves badly until the file STOP exists. Its root lives on meanwhile (so `run`
keeps supervising it) until STOP, or until STOP_ROOT: then the root alone exits, the rest goes
on. With the lock already taken it logs `overlap` to LOG: two trees of one session alive at once.

- hopper: a branch that forks its successor and exits, over and over, keeping the token.
- dropper: a child that removes the token from its environment and lives on.
- setsid: double-forks into a new session (setsid), keeping the token.
All of them ignore SIGTERM.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

_PRELUDE = """exec 9>>"$LOCK"
flock -n 9 || { echo overlap >> "$LOG"; exit 3; }
echo up > "$READY"
trap '' TERM
"""
# The root lives until STOP, or until STOP_ROOT, when it says `down` on READY and exits alone.
_ROOT = 'while [ ! -e "$STOP" ] && [ ! -e "$STOP_ROOT" ]; do sleep 0.05; done\n' \
        '[ -e "$STOP_ROOT" ] && echo down > "$READY"\n'
SCRIPTS = {
    "hopper.sh": _PRELUDE + 'sh "$DIR/hop.sh" &\n' + _ROOT,
    # Each hop checks STOP, starts its successor in the background and exits at once.
    "hop.sh": 'trap \'\' TERM\n[ -e "$STOP" ] && exit 0\nsh "$DIR/hop.sh" &\n',
    "dropper.sh": _PRELUDE + 'env -u "$TOKEN_VAR" sh "$DIR/idle.sh" &\n' + _ROOT,
    "setsid.sh": _PRELUDE + 'setsid sh "$DIR/detach.sh" &\n' + _ROOT,
    "detach.sh": 'trap \'\' TERM\nsh "$DIR/idle.sh" &\nexit 0\n',
    "idle.sh": 'trap \'\' TERM\nwhile [ ! -e "$STOP" ]; do sleep 0.05; done\n',
}
KINDS = ("hopper", "dropper", "setsid")


class HostileTree:
    """The files one hostile tree uses, in a directory every user may write (runs by nobody too)."""

    def __init__(self, directory: Path, kind: str, token_var: str = "HOLDFAST_SPAWN_TOKEN") -> None:
        self.kind = kind
        self.dir = directory
        self.lock, self.log, self.stop_file = directory / "lock", directory / "log", directory / "stop"
        self.stop_root = directory / "stop-root"
        self.ready = directory / f"ready-{os.urandom(4).hex()}"
        os.mkfifo(self.ready, 0o666)
        self.lock.touch()
        for path in (self.ready, self.lock):
            os.chmod(path, 0o666)  # the tree may run as an unprivileged user
        for name, text in SCRIPTS.items():
            (directory / name).write_text(text)
            os.chmod(directory / name, 0o644)
        self.env = {"LOCK": str(self.lock), "LOG": str(self.log), "STOP": str(self.stop_file),
                    "READY": str(self.ready), "TOKEN_VAR": token_var, "DIR": str(directory),
                    "STOP_ROOT": str(self.stop_root)}

    @property
    def argv(self) -> list[str]:
        return ["sh", str(self.dir / f"{self.kind}.sh")]

    def wait_up(self) -> None:
        """Blocks until the tree has its lock and says so (the FIFO's open waits for the writer)."""
        with open(self.ready) as f:
            assert f.read().strip() == "up"

    def end_root(self) -> None:
        """The root exits alone (its pid is then absent); the rest of the tree goes on."""
        self.stop_root.touch()
        with open(self.ready) as f:
            assert f.read().strip() == "down"

    def alive(self) -> bool:
        """Whether any process of the tree lives: its lock is held."""
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def overlaps(self) -> int:
        return self.log.read_text().count("overlap") if self.log.exists() else 0

    def end(self, timeout: float = 30.0) -> None:
        """Asks the tree to stop and waits, on the lock, until its last process is gone."""
        self.stop_file.touch()
        subprocess.run(["flock", "-w", str(timeout), str(self.lock), "true"], check=True)
