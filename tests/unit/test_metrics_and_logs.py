"""Pure parts of metrics and logging: the session census count, the indeterminate clock, and the
two log formats carrying session, fence and host."""

from __future__ import annotations

import json
import logging

from holdfast.common import logs
from holdfast.coordinator import metrics
from holdfast.v1 import coordinator_pb2 as pb


def record(status: int, stage: int) -> pb.SessionRecord:
    return pb.SessionRecord(lease=pb.Lease(claim_status=status, handoff_stage=stage))


def test_census_counts_by_claim_status_and_stage() -> None:
    got = metrics.count_sessions([record(pb.LIVE, pb.NONE), record(pb.LIVE, pb.NONE),
                                  record(pb.LIVE, pb.HANDOFF_REQUESTED), record(pb.RELEASED, pb.NONE)])
    assert got == {("live", "none"): 2, ("live", "handoff_requested"): 1, ("released", "none"): 1}


def test_indeterminate_clock_runs_only_through_an_unbroken_run_of_unknowns() -> None:
    clock = metrics.IndeterminateSince()

    def sessions() -> dict[str, float]:
        (family,) = clock.collect()
        return {s.labels["session"]: s.value for s in family.samples}

    clock.verdict("s1", "OWNERSHIP_UNKNOWN")
    clock.verdict("s2", "HELD")
    first = sessions()
    assert set(first) == {"s1"} and first["s1"] >= 0
    clock.verdict("s1", "OWNERSHIP_UNKNOWN")  # a second unknown keeps the first start
    assert sessions()["s1"] >= first["s1"]
    clock.verdict("s1", "OWNER_DEAD")
    assert sessions() == {}


def _format(formatter: logging.Formatter) -> str:
    entry = logging.LogRecord("holdfast.coordinator.sessions", logging.INFO, __file__, 1, "session %s",
                              ("grant",), None)
    entry.fields = logs.session_fields("sess-0001", 7, "node-a", transition="grant")
    return formatter.format(entry)


def test_both_formats_carry_session_fence_and_host() -> None:
    line = json.loads(_format(logs.JsonFormatter()))
    assert (line["session"], line["fence"], line["host"], line["msg"]) == ("sess-0001", 7, "node-a",
                                                                           "session grant")
    text = _format(logs.TextFormatter())
    assert "session grant session=sess-0001 fence=7 host=node-a transition=grant" in text
