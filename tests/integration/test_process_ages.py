"""proc/ages.py with real processes: a scan takes an old process's age from a pidfd-checked record
instead of its stat, and never for a process that is not the one the record was read from — not
even a young token carrier that took an old process's pid (forced here through ns_last_pid)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from holdfast.proc.ages import ProcessAges
from holdfast.proc.procstat import parse_stat
from holdfast.proc.scan import scan

pytestmark = [pytest.mark.timeout(60)]
VARIABLE = b"HOLDFAST_TEST_AGES_TOKEN"
TOKEN = b"a" * 32
REUSE_TRIES = 50  # other processes fork too (xdist workers): the forced pid is retried, boundedly


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return parse_stat(f.read()).start_ticks


def now_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def boot_ticks_after(ticks: int) -> None:
    """Returns once the clock has passed `ticks`, so a process started then has a later start tick
    (a bounded spin on the clock itself: the event waited for is the tick)."""
    for _ in range(10_000_000):
        if now_ticks() > ticks:
            return
    raise TimeoutError("the clock's ticks did not advance")


@pytest.fixture
def ages() -> Iterator[ProcessAges]:
    kept = ProcessAges(limit=100_000)
    yield kept
    kept.close()


def sleeper(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], env=env)


def test_a_scan_with_ages_finds_exactly_what_one_without_finds(ages: ProcessAges) -> None:
    old = [sleeper() for _ in range(20)]
    try:
        boot_ticks_after(max(start_ticks(p.pid) for p in old))
        since = now_ticks()
        young = [sleeper({**os.environ, VARIABLE.decode(): TOKEN.decode()}) for _ in range(3)]
        try:
            first = scan(VARIABLE, TOKEN, born_since=since, ages=ages)  # learns every age
            known = ages.alive()
            assert all(p.pid in known for p in old)
            again = scan(VARIABLE, TOKEN, born_since=since, ages=ages)  # the old ones from ages
            plain = scan(VARIABLE, TOKEN, born_since=since)
            for found in (first, again, plain):
                assert found.complete
                assert sorted(c.pid for c in found.carriers) == sorted(p.pid for p in young)
            # Judged old the same way; how many young ones each read is not compared: other tests'
            # processes (xdist workers fork) are born between the two scans.
            assert again.older == plain.older
        finally:
            for p in young:
                p.kill()
                p.wait()
    finally:
        for p in old:
            p.kill()
            p.wait()


def test_an_exited_process_is_forgotten(ages: ProcessAges) -> None:
    proc = sleeper()
    scan(VARIABLE, TOKEN, born_since=1, ages=ages)
    assert ages.alive()[proc.pid] == start_ticks(proc.pid)
    proc.kill()
    proc.wait()  # reaped: its pid may be anyone's now
    assert proc.pid not in ages.alive()


def test_past_its_limit_a_process_is_read_as_if_never_seen() -> None:
    small = ProcessAges(limit=1)
    procs = [sleeper() for _ in range(3)]
    try:
        found = scan(VARIABLE, TOKEN, born_since=1, ages=small)
        assert len(small.alive()) == 1 and found.stable
    finally:
        small.close()
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="forcing a pid through ns_last_pid needs root")
def test_a_young_carrier_on_an_old_processs_reused_pid_is_read_not_taken_for_it(ages: ProcessAges) -> None:
    carrier_env = {**os.environ, VARIABLE.decode(): TOKEN.decode()}
    for _ in range(REUSE_TRIES):
        old = sleeper()
        scan(VARIABLE, TOKEN, born_since=1, ages=ages)  # its age recorded, under its pidfd
        old_ticks = ages.alive()[old.pid]
        boot_ticks_after(old_ticks)
        old.kill()
        old.wait()
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(old.pid - 1))
        young = subprocess.Popen(["sleep", "600"], env=carrier_env)
        if young.pid != old.pid:
            young.kill()
            young.wait()
            continue
        try:
            since = start_ticks(young.pid)
            assert since > old_ticks
            # Were the old record used for this pid, the carrier would be taken as older than
            # `since`, its environ never read, and the tree declared gone.
            found = scan(VARIABLE, TOKEN, born_since=since, ages=ages)
            assert [c.pid for c in found.carriers] == [young.pid], found
            assert ages.alive()[young.pid] == since
            return
        finally:
            young.kill()
            young.wait()
    pytest.fail(f"the old pid was not reused in {REUSE_TRIES} tries", pytrace=False)
