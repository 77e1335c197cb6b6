"""Pure parts of metrics and logging: the session census count, the indeterminate clock, the
two log formats carrying session, fence and host, and a JSON log that stays one object a line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from holdfast.common import logs
from holdfast.coordinator import census, metrics
from holdfast.v1 import coordinator_pb2 as pb


def record(status: int, stage: int) -> pb.SessionRecord:
    return pb.SessionRecord(lease=pb.Lease(claim_status=status, handoff_stage=stage))


def test_census_counts_by_claim_status_and_stage() -> None:
    got = census.count_sessions([record(pb.LIVE, pb.NONE), record(pb.LIVE, pb.NONE),
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


# What a server's stderr met besides holdfast's own lines: another library's logger, a warning, its
# last words, an exception in a thread, and an uncaught CancelledError ending asyncio.run.
NOISE = """
import asyncio, logging, threading, warnings
from holdfast.common import logs
logs.setup("json", "info")
logging.getLogger("holdfast.coordinator").info("ours", extra={"fields": {"session": "s-1"}})
logging.getLogger("holdfast.coordinator").debug("below the level")
logging.getLogger("asyncio").error("Task exception was never retrieved")
logging.getLogger("aetcd").info("a library's info")
warnings.warn("an old call")
logs.fatal("cannot listen on 127.0.0.1:1: address in use")
worker = threading.Thread(target=lambda: 1 / 0, name="worker")
worker.start()
worker.join()

async def main() -> None:
    raise asyncio.CancelledError

asyncio.run(main())
"""


def test_a_json_log_is_one_object_a_line_whatever_writes_to_it() -> None:
    done = subprocess.run([sys.executable, "-c", NOISE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each line one JSON object
    assert [(e["logger"], e["level"]) for e in lines] == [
        ("holdfast.coordinator", "info"), ("asyncio", "error"), ("py.warnings", "warning"),
        ("holdfast", "critical"), ("holdfast.uncaught", "critical"), ("holdfast.uncaught", "critical")]
    assert lines[0]["session"] == "s-1" and "an old call" in lines[2]["msg"] and "in use" in lines[3]["msg"]
    assert "ZeroDivisionError" in lines[4]["error"] and "CancelledError" in lines[5]["error"]
