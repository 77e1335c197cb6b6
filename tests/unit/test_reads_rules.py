"""The bookkeeping of reads of other processes' memory given up as stuck (agent/reads_rules.py)."""

from __future__ import annotations

from holdfast.agent.reads_rules import MAX_GIVE_UPS, STUCK_AFTER_S, Parked, recheck_in, stuck


def test_a_process_whose_read_is_pending_is_refused_until_it_returns() -> None:
    parked = Parked(limit=4)
    assert parked.refusal((10, 500)) == ""
    parked.park((10, 500))
    assert "pid 10" in parked.refusal((10, 500))
    parked.unpark((10, 500))
    assert parked.refusal((10, 500)) == "" and parked.total == 0 and not parked.reads


def test_a_reused_pid_is_another_process() -> None:
    parked = Parked(limit=4)
    parked.park((10, 500))
    assert parked.refusal((10, 501)) == ""


def test_past_the_limit_no_read_starts_and_one_returning_frees_a_place() -> None:
    parked = Parked(limit=2)
    parked.park((10, 500))
    parked.park((11, 500))
    assert "2 reads" in parked.refusal((12, 500))
    parked.unpark((11, 500))
    assert parked.refusal((12, 500)) == ""


def test_two_threads_parked_on_one_process_both_count() -> None:
    parked = Parked(limit=4)
    parked.park((10, 500))
    parked.park((10, 500))  # two reads of it were under way when the first was given up
    parked.unpark((10, 500))
    assert parked.refusal((10, 500)) != "" and parked.total == 1
    parked.unpark((10, 500))
    assert parked.refusal((10, 500)) == "" and parked.total == 0


def test_a_read_is_stuck_only_once_it_has_lasted_the_bound() -> None:
    assert not stuck(100.0, 100.0 + STUCK_AFTER_S / 2)
    assert stuck(100.0, 100.0 + STUCK_AFTER_S)


def test_the_question_is_asked_again_when_the_read_under_way_would_be_stuck() -> None:
    assert recheck_in(None, 100.0) == STUCK_AFTER_S
    assert recheck_in(100.0, 100.0 + STUCK_AFTER_S / 4) == STUCK_AFTER_S * 3 / 4
    assert recheck_in(100.0, 100.0 + 2 * STUCK_AFTER_S) == 0.0


def test_a_job_given_up_the_most_times_reads_nothing_more() -> None:
    """A process whose reads stick and then return is not refused once they returned: without the
    count, a job's runs again could each be given up on it, for ever."""
    parked = Parked(limit=4)
    assert parked.refusal((10, 500), given_up=MAX_GIVE_UPS - 1) == ""
    assert f"given up {MAX_GIVE_UPS} times" in parked.refusal((10, 500), given_up=MAX_GIVE_UPS)
