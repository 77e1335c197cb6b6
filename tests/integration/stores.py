"""Real PostgreSQL and Redis servers for the guard tests (Debian's `postgresql` and `redis-server`,
installed by scripts/setup): each on a free loopback port, in the test's own directory, ready when
the server says so on its log, and stopped by its pid."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

READY_WITHIN_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(argv: list[str], ready: bytes, what: str, **popen: Any) -> Iterator[None]:
    """The server `argv` from its start until it printed `ready` on its log (stdout and stderr
    together; a failure to start says what it printed), then until the block ends: stopped by its
    pid. The rest of its log is drained in a thread, so a full pipe never stalls it."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)
    try:
        assert proc.stdout is not None
        seen = b""
        while ready not in seen:
            line = proc.stdout.readline()
            if not line:
                said = seen.decode(errors="replace")[-2000:]
                raise RuntimeError(f"{what} exited before it was ready: {said}")
            seen += line
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory)]
    with serving(argv, b"Ready to accept connections", "redis-server"):
        yield f"redis://127.0.0.1:{port}/0"


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise RuntimeError("no PostgreSQL server: scripts/setup installs Debian's postgresql")
    return Path(found[-1]).parent


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway cluster (trust authentication on loopback, fsync off) in a directory of its own
    under the temp dir, as the `postgres` user when run as root (PostgreSQL refuses root, and
    cannot enter pytest's 0700 tmp of root)."""
    bindir, port = _postgres_bin(), free_port()
    directory = Path(tempfile.mkdtemp(prefix="holdfast-pg-"))
    try:
        data = directory / "pgdata"
        data.mkdir()
        user = "postgres" if os.geteuid() == 0 else None
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (directory, data):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        initdb = [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]
        subprocess.run(initdb, check=True, capture_output=True, user=user, cwd=directory)
        server = [str(bindir / "postgres"), "-D", str(data), "-k", str(data), "-h", "127.0.0.1",
                  "-p", str(port), "-c", "fsync=off", "-c", "logging_collector=off"]
        with serving(server, b"ready to accept connections", "postgres", user=user, cwd=directory):
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
