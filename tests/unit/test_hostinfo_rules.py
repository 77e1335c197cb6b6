"""When the agent refuses to start: start times read under a time namespace's offsets, or a machine id
that names no one machine (agent/hostinfo_rules.py), as pure functions of what it read."""

from __future__ import annotations

import pytest

from holdfast.agent import hostinfo_rules
from holdfast.agent.hostinfo_rules import refusal
from holdfast.common.timens_rules import INIT_TIME_NS, parse_offsets, time_namespace_problem

MACHINE = "3d1219c7c4c5404aaa1f6d2a48adfda4"
# As the kernel prints them ("%-10s %10lld %9ld"), one line per clock.
ZERO = "monotonic           0         0\nboottime            0         0\n"
SHIFTED = "monotonic           0         0\nboottime       100000         0\n"


def test_the_kernels_lines_parse_by_clock() -> None:
    assert parse_offsets(ZERO) == {"monotonic": (0, 0), "boottime": (0, 0)}
    assert parse_offsets("monotonic -5 999999999\nboottime 7 0\n") == {"monotonic": (-5, 999999999),
                                                                        "boottime": (7, 0)}
    assert parse_offsets("boottime 1\n") is None
    assert parse_offsets("boottime x 0\n") is None


def test_the_initial_time_namespace_and_a_kernel_without_them_serve() -> None:
    assert time_namespace_problem(INIT_TIME_NS, ZERO) == ""
    assert time_namespace_problem(None, None) == ""
    assert refusal(MACHINE, INIT_TIME_NS, ZERO) == refusal(MACHINE, None, None) == ""


@pytest.mark.parametrize("offsets", [SHIFTED, "monotonic 3600 0\nboottime 0 0\n",
                                     "monotonic 0 0\nboottime 0 1\n"])
def test_any_offset_refuses_naming_it_and_the_fix(offsets: str) -> None:
    """The review's repro: an agent under `unshare --time --boottime 100000` read a live owner's
    start 100000 s later than the agent before it had, and proved it dead."""
    for time_ns in (INIT_TIME_NS, 4026532174):
        why = refusal(MACHINE, time_ns, offsets)
        assert "time namespace with offsets" in why and "/proc/<pid>/stat" in why
        assert why.endswith(hostinfo_rules.TIME_NS_FIX)
    assert "boottime 100000s 0ns" in time_namespace_problem(INIT_TIME_NS, SHIFTED)


def test_another_time_namespace_refuses_even_with_zero_offsets() -> None:
    """A restore re-creates it with offsets under the running agent."""
    why = time_namespace_problem(4026532174, ZERO)
    assert "4026532174" in why and "restore" in why


@pytest.mark.parametrize("offsets", ["", "boottime 0 0\n", "garbage\n", "monotonic 0 0\nboottime zero 0\n"])
def test_offsets_it_cannot_read_refuse(offsets: str) -> None:
    assert "unknown" in time_namespace_problem(INIT_TIME_NS, offsets)
    assert "unknown" in time_namespace_problem(None, offsets)
    assert time_namespace_problem(INIT_TIME_NS, None)  # the namespace without its offsets file


@pytest.mark.parametrize("machine_id", ["", "uninitialized", "0" * 32, MACHINE[:-1], "g" * 32])
def test_a_machine_id_naming_no_one_machine_refuses(machine_id: str) -> None:
    why = refusal(machine_id, INIT_TIME_NS, ZERO)
    assert "prove each other's owners dead" in why and why.endswith(hostinfo_rules.MACHINE_ID_FIX)
