"""What a user meets around the commands (issue 17, "Errors and conventions"): a version, a quiet
exit into a closed pipe. Against a real coordinator and etcd where a command needs one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from holdfast.agent.service import VERSION
from tests.integration.coordinator_fixtures import Coordinator

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = pytest.mark.timeout(120)

HOLDFAST = [sys.executable, "-m", "holdfast.coordinator.cli"]


def test_version_as_flag_and_as_command() -> None:
    flag = subprocess.run([*HOLDFAST, "--version"], capture_output=True, text=True, timeout=30)
    assert flag.returncode == 0 and flag.stdout.startswith(f"holdfast {VERSION} ")
    command = subprocess.run([*HOLDFAST, "version"], capture_output=True, text=True, timeout=30)
    assert command.returncode == 0 and command.stdout == flag.stdout
    as_json = subprocess.run([*HOLDFAST, "version", "--json"], capture_output=True, text=True, timeout=30)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["version"] == VERSION


def into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """`holdfast ARGV | head -0`, deterministically: the reading end is closed before the command
    starts, so its first write to stdout meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*HOLDFAST, *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_a_closed_pipe_is_a_quiet_exit(coordinator: Coordinator, json_flag: tuple[str, ...]) -> None:
    done = into_closed_pipe("status", "--coordinator", coordinator.address, *json_flag)
    assert (done.returncode, done.stderr) == (141, "")
    assert (into_closed_pipe("version").returncode, into_closed_pipe("version").stderr) == (141, "")
