"""The systemd units of deploy/systemd, for hosts without Kubernetes.

`systemd-analyze verify` finds nothing to say about any unit (its executables stood in for under a
root of their own), and `systemd-analyze security` rates each within its bound. The agent's unit
keeps exactly the capabilities its work needs and no setting that would break it (a read-only
cgroup file system, a delegated cgroup); the coordinator's and etcd's keep none. Readiness is real:
a server under a service manager sends READY=1 only once its ready file is written (it accepts
calls) and STOPPING=1 when it drains. scripts/container-test runs the units under systemd as PID 1.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SERVICES = sorted(UNITS.glob("*.service"))
AGENT_CAPS = {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_KILL", "CAP_SYS_ADMIN"}
# `systemd-analyze security` exposure (0 safest, 10 none): the agent is root with four capabilities.
EXPOSURE = {"holdfast-agent.service": 5.0, "holdfast-coordinator.service": 2.0, "holdfast-etcd.service": 4.0}


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "no systemd-analyze: run ./scripts/setup (it installs Debian's systemd)"
    return found


def settings(unit: Path) -> dict[str, list[str]]:
    """Each `Key=` of the unit's [Service] section with every value it is given, in order."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root for `--root`: the distribution's units (the targets ours name), ours, and executable
    stand-ins at the paths their ExecStart= name."""
    base = tmp_path_factory.mktemp("systemd-root")
    shutil.copytree("/usr/lib/systemd/system", base / "usr/lib/systemd/system", symlinks=True)
    for unit in SERVICES:
        (command,) = settings(unit)["ExecStart"]
        stand_in = base / command.split()[0].lstrip("/")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("#!/bin/sh\n")
        stand_in.chmod(0o755)
        target = base / "etc/systemd/system" / unit.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(unit, target)
    return base


@pytest.mark.parametrize("unit", SERVICES, ids=lambda u: u.name)
def test_systemd_analyze_verify_has_nothing_to_say(root: Path, unit: Path) -> None:
    done = subprocess.run([systemd_analyze(), "verify", f"--root={root}",
                           str(root / "etc/systemd/system" / unit.name)],
                          capture_output=True, text=True, timeout=60)
    # An unknown key or a bad value is a warning with exit 0: the output must be empty too.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


@pytest.mark.parametrize("unit", SERVICES, ids=lambda u: u.name)
def test_systemd_analyze_security_rates_each_unit_within_its_bound(root: Path, unit: Path) -> None:
    done = subprocess.run([systemd_analyze(), "security", "--offline=true", f"--root={root}",
                           str(root / "etc/systemd/system" / unit.name)],
                          capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= EXPOSURE[unit.name], done.stdout


def test_the_agent_unit_has_only_the_capabilities_its_work_needs_and_keeps_cgroups_writable() -> None:
    agent = settings(UNITS / "holdfast-agent.service")
    assert agent["User"] == ["root"] and set(agent["CapabilityBoundingSet"][0].split()) == AGENT_CAPS
    assert "AmbientCapabilities" not in agent and agent["NoNewPrivileges"] == ["yes"]
    # The agent writes /sys/fs/cgroup (session cgroups, cgroup.kill); sessions are not its unit's.
    for breaking in ("ProtectControlGroups", "ProtectKernelTunables", "Delegate", "ReadOnlyPaths"):
        assert breaking not in agent, breaking
    assert agent["ProtectSystem"] == ["strict"]  # /sys stays writable under strict
    # Session cgroups it makes stay readable: `run` reads its own cgroup.events (a 0700 one never ended).
    assert agent["UMask"] == ["0022"]
    environment = " ".join(agent["Environment"]).split()
    assert {"HOLDFAST_LOG_FORMAT=json", "HOLDFAST_NODE=true",
            "HOLDFAST_NODE_CGROUP_NAMESPACE=true"} <= set(environment)


@pytest.mark.parametrize("name", ["holdfast-agent", "holdfast-coordinator"])
def test_the_servers_are_notify_services_restarted_always_logging_json(name: str) -> None:
    unit = settings(UNITS / f"{name}.service")
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["Restart"] == ["always"] and unit["SyslogIdentifier"] == [name]
    assert "HOLDFAST_LOG_FORMAT=json" in " ".join(unit["Environment"]).split()
    command = unit["ExecStart"][0].split()
    assert command == ["/opt/holdfast/bin/holdfast", name.removeprefix("holdfast-"), "serve"]
    assert unit["EnvironmentFile"] == [f"/etc/holdfast/{name.removeprefix('holdfast-')}.env"]


def test_the_coordinator_and_etcd_run_unprivileged_with_no_capability() -> None:
    for name in ("holdfast-coordinator", "holdfast-etcd"):
        unit = settings(UNITS / f"{name}.service")
        assert unit["User"] == ["holdfast"] and unit["CapabilityBoundingSet"] == [""], name
        assert unit["ProtectControlGroups"] == ["yes"] and unit["NoNewPrivileges"] == ["yes"], name


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_a_server_says_ready_only_once_it_serves_and_stopping_when_it_drains(
        tmp_path: Path, abstract: bool) -> None:
    name = f"holdfast-notify-{tmp_path.name}" if abstract else str(tmp_path / "notify")
    ready = tmp_path / "ready.json"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind("\0" + name if abstract else name)
        manager.settimeout(30)
        agent = subprocess.Popen([sys.executable, "-m", "holdfast.cli", "agent", "serve", "--listen",
                                  "127.0.0.1:0", "--host-id", "notify-host", "--ready-file", str(ready)],
                                 env={**os.environ, "NOTIFY_SOCKET": f"@{name}" if abstract else name},
                                 stderr=subprocess.PIPE)
        try:
            assert manager.recv(4096) == b"READY=1"
            assert ready.exists(), "READY=1 before the ready file: before it accepted calls"
        finally:
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err
        assert manager.recv(4096) == b"STOPPING=1"
