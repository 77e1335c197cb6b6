"""The doctor's checks as pure functions of gathered facts: each failure names its fix."""

from __future__ import annotations

import dataclasses

from holdfast.agent import doctor

GOOD = doctor.Facts(
    node=True, pid_ns=doctor.INIT_PID_NS, cap_eff=1 << doctor.CAP_SYS_PTRACE, environ_read=40,
    environ_denied=0, environ_other_users=12, environ_error="", pidfs=True, cgroup_root="/sys/fs/cgroup",
    cgroup_problem="", boot_id="b", machine_id="m", coordinator="c:1", coordinator_error="",
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
        "coordinator": {"coordinator_error": "unreachable (UNAVAILABLE)"},
    }
    for name, change in broken.items():
        checks = doctor.run_checks(dataclasses.replace(GOOD, **change))
        failed = [c for c in checks if c.status == "fail"]
        assert [c.name for c in failed] == [name]
        assert failed[0].fix and not doctor.healthy(checks)
        assert "fix: " in doctor.render_text(checks)


def test_unconfigured_checks_skip_and_do_not_fail() -> None:
    facts = dataclasses.replace(GOOD, node=False, pid_ns=4026532000, coordinator="")
    got = statuses(facts)
    assert got["init-pid-namespace"] == "skip" and got["coordinator"] == "skip"
    assert doctor.healthy(doctor.run_checks(facts))
