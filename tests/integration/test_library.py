"""The public library (holdfast.client) against a real stack — etcd, a coordinator, simulated hosts
with their agents — in both forms: leaving the block releases the grant with CMD's tree gone; an
exception in it does too and goes on; a takeover from another host makes the old owner's fenced
write raise StaleFence. The example program runs as documented, and `mypy --strict` accepts it and the
public API's own modules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import psutil
import pytest

from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.run_fixtures import Cluster, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
ROOT = Path(__file__).resolve().parents[2]
DRIVER = str(Path(__file__).with_name("library_driver.py"))
EXAMPLE = ROOT / "examples" / "embed.py"
FORMS = ["sync", "async"]


def drive(cluster: Cluster, host_id: str, form: str, scenario: str, session: str) -> subprocess.Popen[bytes]:
    host = cluster.hosts.get(host_id) or cluster.host(host_id)
    return host.spawn([sys.executable, DRIVER, form, scenario, session], env=cluster.env(host),
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def lease(cluster: Cluster, session: str) -> tuple[int, int]:
    record = cluster.record(session).record
    return record.lease.claim_status, record.lease.fence


@pytest.mark.parametrize("form", FORMS)
def test_leaving_the_block_ends_cmd_and_releases(cluster: Cluster, form: str) -> None:
    session = f"lib-exit-{form}"
    out, err = drive(cluster, f"lib-exit-{form}", form, "exit", session).communicate(timeout=60)
    lines = out.decode().splitlines()
    assert lines[0].split()[:2] == ["held", "1"] and int(lines[0].split()[2]) > 0, err.decode()
    assert lines[1:] == ["signals True", "released False True", "done"], err.decode()
    assert lease(cluster, session) == (pb.RELEASED, 1)


@pytest.mark.parametrize("form", FORMS)
def test_an_exception_in_the_block_releases_and_goes_on(cluster: Cluster, form: str) -> None:
    session = f"lib-raise-{form}"
    proc = drive(cluster, f"lib-raise-{form}", form, "raise", session)
    out, err = proc.communicate(timeout=60)
    assert out.decode().splitlines() == ["reraised inside True", "done"], err.decode()
    assert lease(cluster, session) == (pb.RELEASED, 1)


@pytest.mark.parametrize("form", FORMS)
def test_a_takeover_from_another_host_makes_the_old_owners_write_stale(cluster: Cluster, form: str) -> None:
    session = f"lib-takeover-{form}"
    old = drive(cluster, f"lib-old-{form}", form, "takeover", session)
    assert old.stdout is not None and old.stdin is not None
    assert old.stdout.readline() == b"held 1\n", old.stderr.read() if old.stderr else b""
    taker = cluster.run(cluster.host(f"lib-new-{form}"), session, "--takeover", cmd=["sleep", "600"])
    until("the takeover's commit", lambda: lease(cluster, session) == (pb.LIVE, 2))
    old.stdin.write(b"go\n")
    old.stdin.flush()
    out, err = old.communicate(timeout=60)
    assert out.decode().splitlines() == ["stale STALE_FENCE handoff", "done"], err.decode()
    assert lease(cluster, session) == (pb.LIVE, 2) and taker.proc.poll() is None


@pytest.mark.parametrize("form", FORMS)
def test_fenced_data_the_provider_handle_and_the_watch(cluster: Cluster, form: str) -> None:
    session = f"lib-data-{form}"
    out, err = drive(cluster, f"lib-data-{form}", form, "data", session).communicate(timeout=60)
    assert out.decode().splitlines() == [
        "watched 1 live True", "got b'v1' thread-1",
        "changed (ProviderHandle(handle='thread-1', minted_at_fence=1),) codex", "done"], err.decode()


@pytest.mark.parametrize("form", FORMS)
def test_forward_signals_passes_a_signal_to_cmd(cluster: Cluster, form: str) -> None:
    session = f"lib-forward-{form}"
    host = cluster.host(f"lib-forward-{form}")
    proc = host.spawn([sys.executable, DRIVER, form, "forward", session], env=cluster.env(host),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held 1\n"
    os.kill(host.outer_pid(proc), signal.SIGTERM)  # to the library's process: forwarded to CMD
    out, err = proc.communicate(timeout=60)
    assert out.decode().splitlines() == [f"status {128 + signal.SIGTERM}", "done"], err.decode()
    assert lease(cluster, session) == (pb.RELEASED, 1)


# "interrupt": a Ctrl-C, to the process; "interrupt-on-loop": one the kernel handed to the library's
# loop thread, as it may hand a process-directed signal to any thread not blocking it (the loop's,
# unblocking signals right after spawning the gate, takes one pending): its handler then runs only
# once the main thread runs again, and a main thread asleep until the work ended never did.
@pytest.mark.parametrize("scenario", ["interrupt", "interrupt-on-loop"])
def test_an_interrupt_while_the_sync_form_waits_cancels_it_and_leaves_nothing(cluster: Cluster,
                                                                               scenario: str) -> None:
    session = f"lib-{scenario}"
    holder = cluster.run(cluster.host(f"lib-holder-{scenario}"), session, cmd=["sleep", "600"])
    until("the holder's commit", lambda: "running on host" in holder.err())
    host = cluster.host(f"lib-waiter-{scenario}")
    waiter = host.spawn([sys.executable, DRIVER, "sync", scenario, session], env=cluster.env(host),
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    driver = psutil.Process(host.outer_pid(waiter))
    # Its gate is spawned just before its Acquire, which the coordinator holds while the session is held.
    until("the waiting run's gate", lambda: driver.children())
    if scenario == "interrupt":
        driver.send_signal(signal.SIGINT)
    out, err = waiter.communicate(b"go\n", timeout=60)  # "interrupt-on-loop" signals its loop thread now
    assert out.decode().splitlines() == ["interrupted []", "done"], err.decode()
    assert lease(cluster, session) == (pb.LIVE, 1) and holder.proc.poll() is None


def test_the_example_program_starts_writes_and_hands_off(cluster: Cluster) -> None:
    host = cluster.host("lib-example")
    proc = host.spawn([sys.executable, str(EXAMPLE), "lib-example"], env=cluster.env(host),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].startswith("fence 1: wrote progress at revision "), out
    assert lines[1:] == ["fence 2: took over; the first run ended by handoff",
                         "fence 1's late write: refused STALE_FENCE", "progress: b'step 2'",
                         f"handed off; the second run's worker ended with status {128 + 15}"], err.decode()
    assert lease(cluster, "lib-example") == (pb.RELEASED, 2)


def installed_tree(tmp: Path) -> Path:
    """The import package `holdfast` as an installed copy lays it out (pyproject's package-dir), for
    mypy, which does not run the editable install's import hook."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, directory in config["package-dir"].items():
        target = tmp.joinpath(*package.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(ROOT / directory)
    return tmp


def test_mypy_strict_accepts_the_example_program_and_the_public_modules(tmp_path: Path) -> None:
    tree = installed_tree(tmp_path / "site")
    # The example and the public API's own modules are checked; the layer below (and the generated
    # protos' stubs, which follow-imports does not silence) is read for its types, its findings not
    # reported.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nfollow_imports = silent\n[mypy-holdfast.*]\nignore_errors = True\n"
                      "[mypy-holdfast.client,holdfast.client.aio,holdfast.client.sync,holdfast.client.results]\n"
                      "ignore_errors = False\n")
    for target in ([str(EXAMPLE)], ["-p", "holdfast.client"]):  # mypy takes files or packages, not both
        checked = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--no-incremental",
             "--cache-dir", os.devnull, *target],
            env={**os.environ, "MYPYPATH": str(tree)}, capture_output=True, text=True, timeout=240,
            cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
