"""The doctor's checks as pure functions of gathered facts: each failure names its fix."""

from __future__ import annotations

import dataclasses

from holdfast.agent import doctor

GOOD = doctor.Facts(
    node=True, pid_ns=doctor.INIT_PID_NS, cap_eff=1 << doctor.CAP_SYS_PTRACE, environ_read=40,
    environ_denied=0, environ_other_users=12, environ_error="", pidfs=True, cgroup_root="/sys/fs/cgroup",
    cgroup_problem="", boot_id="b", machine_id="0f" * 16, coordinator="c:1", coordinator_error="",
    cert_seconds_left=20 * 3600.0, fenced="", ptrace_scope=1,
)


def statuses(facts: doctor.Facts) -> dict[str, str]:
    return {c.name: c.status for c in doctor.run_checks(facts)}


def test_a_good_node_passes_every_check() -> None:
    checks = doctor.run_checks(GOOD)
    assert {c.status for c in checks} == {"pass"} and doctor.healthy(checks)
    assert doctor.as_json(checks)["ok"] is True


def test_each_broken_fact_fails_exactly_its_check_with_a_fix() -> None:
    broken = {
        "init-pid-namespace": {"pid_ns": 4026532000},
        "cap-sys-ptrace": {"cap_eff": 0x1fffe7fffff & ~(1 << doctor.CAP_SYS_PTRACE)},
        "environ-readable": {"environ_denied": 3, "environ_error": "pid 1 (uid 0): Permission denied"},
        "pidfs": {"pidfs": False},
        "cgroup-v2": {"cgroup_problem": "/proc/1/cgroup reads '/../..': private cgroup namespace"},
        "boot-id": {"machine_id": ""},
        "time-namespace": {"time_ns": 4026531834, "timens_offsets": "monotonic 0 0\nboottime 100000 0\n"},
        "coordinator": {"coordinator_error": "unreachable (UNAVAILABLE)"},
        "certificate": {"cert_seconds_left": 5 * 3600.0},
        "fenced": {"fenced": "this incarnation was proven off by /usr/sbin/fence_ipmilan"},
    }
    for name, change in broken.items():
        checks = doctor.run_checks(dataclasses.replace(GOOD, **change))
        failed = [c for c in checks if c.status == "fail"]
        assert [c.name for c in failed] == [name]
        assert failed[0].fix and not doctor.healthy(checks)
        assert "fix: " in doctor.render_text(checks)


def test_a_host_without_yama_warns_with_its_fix_and_stays_ready() -> None:
    """Without Yama at 1 or more every tree's end needs a complete scan too: sound, only weaker, so
    the agent stays Ready (its readiness probe is the doctor) and the line says how to fix it."""
    for scope, said in ((None, "absent (no Yama)"), (0, "is 0")):
        checks = doctor.run_checks(dataclasses.replace(GOOD, ptrace_scope=scope))
        [check] = [c for c in checks if c.name == "ptrace-scope"]
        assert check.status == "warn" and said in check.detail and "sysctl" in check.fix
        assert [c.name for c in checks if c.status != "pass"] == ["ptrace-scope"]
        assert doctor.healthy(checks) and doctor.as_json(checks)["ok"] is True
        assert "fix: set kernel.yama.ptrace_scope=1" in doctor.render_text(checks)
    assert statuses(dataclasses.replace(GOOD, ptrace_scope=2))["ptrace-scope"] == "pass"


def test_unconfigured_checks_skip_and_do_not_fail() -> None:
    facts = dataclasses.replace(GOOD, node=False, pid_ns=4026532000, coordinator="", cert_seconds_left=None)
    got = statuses(facts)
    assert got["init-pid-namespace"] == "skip" and got["coordinator"] == "skip"
    assert got["certificate"] == "skip"
    assert doctor.healthy(doctor.run_checks(facts))


INIT = doctor.Unreadable(1, "process_api", 0, 25, "Permission denied")
OTHER = doctor.Unreadable(4242, "codex", 1000, 900_000, "Permission denied")


def test_only_the_namespace_init_unreadable_passes_naming_it_and_why() -> None:
    """Issue 17: root failed environ-readable on the sandbox's own PID 1 alone, with a ptrace fix
    that did not apply. PID 1 is older than every tree root, which the stable scan never counts."""
    facts = dataclasses.replace(GOOD, environ_denied=1, environ_error="pid 1 (uid 0): Permission denied",
                                unreadable=(INIT,))
    [check] = [c for c in doctor.run_checks(facts) if c.name == "environ-readable"]
    assert check.status == "pass" and not check.fix and doctor.healthy(doctor.run_checks(facts))
    assert "pid 1 (process_api, uid 0, started 0.25s after boot; Permission denied)" in check.detail
    assert "init" in check.detail and "no fix needed" in check.detail


def test_any_other_unreadable_process_fails_naming_it_with_the_ptrace_fix() -> None:
    many = tuple(dataclasses.replace(OTHER, pid=4242 + i) for i in range(5))
    for unreadable in ((INIT, OTHER), (OTHER,), many):
        facts = dataclasses.replace(GOOD, environ_denied=len(unreadable), environ_error="x",
                                    unreadable=unreadable)
        [check] = [c for c in doctor.run_checks(facts) if c.name == "environ-readable"]
        assert check.status == "fail" and "CAP_SYS_PTRACE" in check.fix
        assert "pid 4242 (codex, uid 1000" in check.detail and "pid 1 " not in check.detail
    assert "and 2 more" in check.detail
    # Denied processes not itemised (an older gatherer) are never excused.
    facts = dataclasses.replace(GOOD, environ_denied=1, environ_error="pid 1 (uid 0): Permission denied")
    assert statuses(facts)["environ-readable"] == "fail"


def test_an_expired_or_unreadable_certificate_fails_naming_how_to_get_one() -> None:
    for change in ({"cert_seconds_left": -3600.0}, {"cert_seconds_left": None, "cert_error": "cannot read"}):
        checks = doctor.run_checks(dataclasses.replace(GOOD, **change))
        [check] = [c for c in checks if c.name == "certificate"]
        assert check.status == "fail" and check.fix


def test_the_fenced_check_is_skipped_when_the_coordinator_was_not_asked() -> None:
    assert statuses(dataclasses.replace(GOOD, fenced=None))["fenced"] == "skip"


def test_a_machine_id_naming_no_one_machine_or_a_shifted_clock_fails_with_its_fix() -> None:
    """What `agent serve` refuses to start on, the readiness probe fails on too."""
    for machine_id in ("uninitialized", "0" * 32, "not-hex"):
        [check] = [c for c in doctor.run_checks(dataclasses.replace(GOOD, machine_id=machine_id))
                   if c.name == "boot-id"]
        assert check.status == "fail" and machine_id in check.detail and "machine-id" in check.fix
    zero = "monotonic           0         0\nboottime            0         0\n"
    shifted = "monotonic           0         0\nboottime       100000         0\n"
    cases = ((None, None, "pass"), (4026531834, zero, "pass"), (4026532174, zero, "fail"),
             (4026532174, shifted, "fail"))
    for time_ns, offsets, status in cases:
        facts = dataclasses.replace(GOOD, time_ns=time_ns, timens_offsets=offsets)
        [check] = [c for c in doctor.run_checks(facts) if c.name == "time-namespace"]
        assert check.status == status, check
        assert (check.fix != "") is (status == "fail")
    assert "boottime 100000s" in check.detail and "unshare --time" in check.fix


def test_a_proc_that_hides_processes_fails_with_its_fix() -> None:
    """A hidden process is not even seen to be unreadable (environ-readable passes): no scan proves a
    tree gone, so every session whose end needs one would wait: a failure, as environ-readable's."""
    why = "/proc is mounted hidepid=invisible and this agent is not in its gid= group (none set)"
    checks = doctor.run_checks(dataclasses.replace(GOOD, proc_hidden=why))
    [check] = [c for c in checks if c.status != "pass"]
    assert (check.name, check.status, check.detail) == ("proc-listing", "fail", why)
    assert "without hidepid" in check.fix and "gid=" in check.fix and not doctor.healthy(checks)
