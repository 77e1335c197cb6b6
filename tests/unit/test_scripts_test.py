"""scripts/test, run in a copy of the checkout whose set-up, ruff and python are stand-ins that log
their arguments: with arguments it is exactly `pytest ARGS`; without, all three phases (the suite
on two workers, the `stalls_reads` tests alone, the fault scenarios) run whatever another gives,
each is reported, and the exit is non-zero if any failed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]


def checkout(tmp_path: Path, failing: str) -> Path:
    """A copy of scripts/test beside stand-ins; the stand-in python exits 1 when its arguments
    contain `failing`, else 0, and logs each call's arguments one line each."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    stands = {
        tmp_path / "scripts" / "setup": "exit 0",
        tmp_path / ".venv" / "bin" / "ruff": "exit 0",
        tmp_path / ".venv" / "bin" / "python": (
            f'echo "$*" >> {tmp_path / "calls"}\n'
            f'case " $* " in *" {failing} "*) exit 1;; esac\nexit 0'),
    }
    for path, body in stands.items():
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)
    return tmp_path


def calls(root: Path) -> list[list[str]]:
    return [line.split() for line in (root / "calls").read_text().splitlines()]


@pytest.mark.parametrize("failing", ["tests/unit", "-m stalls_reads", "tests/faults", "none"])
def test_every_phase_runs_and_any_failure_fails_the_run(tmp_path: Path, failing: str) -> None:
    root = checkout(tmp_path, failing)
    done = subprocess.run([root / "scripts" / "test"], capture_output=True, text=True, timeout=60)
    assert [call[-1] for call in calls(root)] == ["tests/deploy", "tests/integration", "tests/faults"]
    assert calls(root)[0][len(PYTEST):len(PYTEST) + 4] == ["-n", "2", "-m", "not"], "the rest, not them"
    main, alone, faults = (int(failing == f) for f in ("tests/unit", "-m stalls_reads", "tests/faults"))
    said = f"unit, integration and deploy exit {main}; alone exit {alone}; faults exit {faults}"
    assert said in done.stdout
    assert (done.returncode != 0) == (failing != "none")


def test_with_arguments_it_is_exactly_pytest_args(tmp_path: Path) -> None:
    root = checkout(tmp_path, "tests/unit/x.py")
    done = subprocess.run([root / "scripts" / "test", "tests/unit/x.py", "-k", "name"],
                          capture_output=True, text=True, timeout=60)
    assert calls(root) == [[*PYTEST, "tests/unit/x.py", "-k", "name"]]
    assert done.returncode == 1 and "exit" not in done.stdout
