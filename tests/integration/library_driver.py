"""The public library (holdfast.client) driven in its sync or async form, inside a simulated host,
for tests/integration/test_library.py. Usage: library_driver.py sync|async SCENARIO SESSION.
Prints one line per event; waits for a line on stdin where the test acts in between."""

from __future__ import annotations

import asyncio
import os
import sys

from holdfast.client import StaleFence, asession, session

CMD = ["sleep", "600"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def say(*words: object) -> None:
    print(*words, flush=True)


def sync_form(scenario: str, session_id: str) -> None:
    if scenario == "exit":
        with session(session_id, CMD) as run:
            say("held", run.fence, run.put("k", b"v"))
        say("released", run.running, gone(run.pid))
    elif scenario == "raise":
        try:
            with session(session_id, CMD) as run:
                raise RuntimeError("inside")
        except RuntimeError as error:
            say("reraised", error, gone(run.pid))
    elif scenario == "takeover":
        with session(session_id, CMD) as run:
            say("held", run.fence)
            sys.stdin.readline()  # the test took the session over from another host
            try:
                run.put("k", b"late")
            except StaleFence as refused:
                say("stale", refused.reason, run.ended_by)


async def async_form(scenario: str, session_id: str) -> None:
    if scenario == "exit":
        async with asession(session_id, CMD) as run:
            say("held", run.fence, await run.put("k", b"v"))
        say("released", run.running, gone(run.pid))
    elif scenario == "raise":
        try:
            async with asession(session_id, CMD) as run:
                raise RuntimeError("inside")
        except RuntimeError as error:
            say("reraised", error, gone(run.pid))
    elif scenario == "takeover":
        async with asession(session_id, CMD) as run:
            say("held", run.fence)
            await asyncio.to_thread(sys.stdin.readline)
            try:
                await run.put("k", b"late")
            except StaleFence as refused:
                say("stale", refused.reason, run.ended_by)


if __name__ == "__main__":
    form, scenario, session_id = sys.argv[1:4]
    if form == "sync":
        sync_form(scenario, session_id)
    else:
        asyncio.run(async_form(scenario, session_id))
    say("done")
