"""The real Codex and Claude Code CLIs (tests/clis/package-lock.json), moved between simulated hosts
by `holdfast codex` and `holdfast claude`, against the stub model server (tests/clis/stub_model.py).

Everything — etcd, the coordinator, the simulated hosts, the stub, the CLIs — runs inside one network
namespace with only loopback up, so no request can leave the machine whatever a CLI tries: this test
runs the cases (real_cli_cases.py) in a pytest of their own under `unshare --net`. The CLIs are
installed by ./scripts/test's set-up (`scripts/setup --with-clis`: `npm ci`); where that could not
be done, this test fails saying why.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.root]
ROOT = Path(__file__).resolve().parents[2]
CLIS = ROOT / "tests" / "clis"
CASES = Path(__file__).with_name("real_cli_cases.py")


def installed() -> str:
    """'' when the pinned CLIs are installed as the lockfile says, else why not."""
    stamp = CLIS / "node_modules" / ".holdfast-lock-sha256"
    lock = hashlib.sha256((CLIS / "package-lock.json").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().split()[0] == lock:
        return ""
    log = CLIS / "npm-ci.log"
    said = log.read_text(errors="replace").strip()[-2000:] if log.exists() else "(setup never ran npm ci)"
    return (f"the pinned agent CLIs are not installed in {CLIS}/node_modules: `./scripts/setup --with-clis` "
            f"(run by ./scripts/test) runs `npm ci` there, which needs node, npm and the npm registry. It "
            f"said:\n{said}")


def test_the_real_clis_move_between_hosts_inside_a_loopback_only_network(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root: simulated hosts are PID namespaces, and the network namespace "
                    "needs CAP_SYS_ADMIN (CI runs as root)")
    if why := installed():
        pytest.fail(why)
    # --basetemp: another pytest on the machine prunes the shared /tmp/pytest-of-<user> under this one.
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
             f"--basetemp={tmp_path / 'cases'}", str(CASES)]
    script = 'ip link set lo up && exec "$@"'
    done = subprocess.run(["unshare", "--net", "--", "sh", "-c", script, "sh", *inner], cwd=ROOT,
                          capture_output=True, text=True, timeout=560, check=False)
    assert done.returncode == 0, f"the cases failed:\n{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
