"""Running `holdfast run` as an unprivileged user (nobody), as most users run it.

That user needs an interpreter it may execute and a holdfast it may import: the project's .venv
is made on /usr/bin/python3 (scripts/setup), which serves wherever the checkout is traversable.
Where it is not (a clone under a root-only directory), a copy of the runtime packages is made once
in a world-readable temporary directory and run with /usr/bin/python3.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

NOBODY = 65534
# setpriv (util-linux): drop to nobody with no groups and no capabilities, as a plain user's shell.
DROP = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all", "--"]
_RUNTIME = ("grpc", "grpc_status", "grpc_health", "grpc_reflection", "google", "aetcd",
            "prometheus_client", "cryptography", "cffi", "_cffi_backend", "typing_extensions")
_HOLDFAST = {"agent": "agent", "coordinator": "coordinator", "v1": "protos/holdfast/v1"}


def _imports_as_nobody(python: str, env: dict[str, str]) -> bool:
    probe = [*DROP, python, "-c", "import holdfast.cli.main"]
    return subprocess.run(probe, env=env, capture_output=True, cwd="/").returncode == 0


@functools.cache
def interpreter() -> tuple[str, dict[str, str]]:
    """(python, extra environment) with which nobody can run `python -m holdfast.cli`."""
    if _imports_as_nobody(sys.executable, dict(os.environ)):
        return sys.executable, {}
    copy = Path(tempfile.mkdtemp(prefix="holdfast-nobody-python-"))
    atexit.register(shutil.rmtree, copy, True)
    os.chmod(copy, 0o755)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if entry.name.split(".")[0].split("-")[0] in _RUNTIME and not entry.name.endswith(".pth"):
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, copy / entry.name)
    repo = Path(__file__).resolve().parents[2]
    for name, source in _HOLDFAST.items():
        shutil.copytree(repo / source, copy / "holdfast" / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [copy, *copy.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    extra = {"PYTHONPATH": str(copy)}
    if not _imports_as_nobody("/usr/bin/python3", {**os.environ, **extra}):
        raise RuntimeError(f"nobody cannot import holdfast even from a copy at {copy}")
    return "/usr/bin/python3", extra


def shared_dir(prefix: str) -> Path:
    """A directory nobody may write (pytest's tmp is root-only); the caller removes it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o777)
    return path
