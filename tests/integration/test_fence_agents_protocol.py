"""The fence-agents protocol as Debian's fence-agents package (4.12.1) speaks it: holdfast's runner
drives the real `fence_dummy` (the package's own library parses the stdin holdfast writes) and its
proof rule reads the lines that library prints. fence_dummy is refused as a configured fencer (it
only flips a state file: docs/operations.md); here it stands for the library every agent shares."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from holdfast.coordinator import fencers
from holdfast.coordinator.fence_rules import Answer, FencerSpec

FENCE_DUMMY = Path("/usr/sbin/fence_dummy")


@pytest.fixture
def dummy() -> str:
    if not FENCE_DUMMY.exists():
        pytest.fail("no /usr/sbin/fence_dummy: run ./scripts/setup (it installs Debian's fence-agents)")
    return str(FENCE_DUMMY)


def test_the_real_library_reads_holdfasts_stdin_and_prints_the_proof(dummy: str, tmp_path: Path) -> None:
    state = tmp_path / "power"
    state.write_text("on")  # fence_dummy's "device": a file holding on or off
    spec = FencerSpec("h1", dummy, (("status_file", str(state)),))
    actions, answer, why = asyncio.run(fencers.fence(spec, "h1", 30.0))
    assert answer is Answer.OFF, (why, [(a.exit_code, a.stdout, a.stderr) for a in actions])
    assert [(a.action, a.exit_code, a.stdout.strip()) for a in actions] == [
        ("off", 0, "Success: Powered OFF"), ("status", 2, "Status: OFF")]
    assert state.read_text() == "off"
    actions, answer, _ = asyncio.run(fencers.fence(spec, "h1", 30.0))
    assert answer is Answer.OFF and actions[0].stdout.strip() == "Success: Already OFF"


def test_a_device_the_library_cannot_read_is_unknown(dummy: str, tmp_path: Path) -> None:
    state = tmp_path / "power"
    state.write_text("jammed")  # neither on nor off: the library fails the action
    actions, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", dummy, (("status_file", str(state)),)),
                                                     "h1", 30.0))
    assert answer is Answer.UNKNOWN and len(actions) == 1 and actions[0].exit_code != 0, why
    assert "Unable to obtain correct plug status" in actions[0].stderr + actions[0].stdout
