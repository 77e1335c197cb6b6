"""The public library (holdfast.client) driven in its sync or async form, inside a simulated host,
for tests/integration/test_library.py. Usage: library_driver.py sync|async SCENARIO SESSION.
Prints one line per event; waits for a line on stdin where the test acts in between."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import psutil

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


def interrupt_the_loop_thread() -> None:
    """SIGINT to the library's loop thread once the test says so: the kernel hands a process-directed
    signal to any thread not blocking it, and its handler then runs in the main thread only once that
    thread runs again."""
    sys.stdin.readline()
    loop = next(thread for thread in threading.enumerate() if thread.name == "holdfast-loop")
    assert loop.ident is not None
    signal.pthread_kill(loop.ident, signal.SIGINT)


def sync_form(scenario: str, session_id: str) -> None:
    if scenario == "exit":
        with session(session_id, CMD) as run:
            say("held", run.fence, run.put("k", b"v"))
            say("signals", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        say("released", run.running, gone(run.pid))
    elif scenario == "data":
        with session(session_id, CMD, provider="codex") as run:
            records = run.watch()
            first = next(records)
            say("watched", first.fence, first.status, first.holder is not None)
            run.put("k", b"v1")
            say("got", run.get("k").value, run.record_handle("thread-1").resume_handle)
            changed = next(records)
            say("changed", changed.provider_handles, changed.provider)
            records.close()
    elif scenario == "forward":
        with session(session_id, CMD, forward_signals=True) as run:
            say("held", run.fence)
            say("status", run.wait())
    elif scenario in ("interrupt", "interrupt-on-loop"):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, whatever the suite's
        if scenario == "interrupt-on-loop":
            threading.Thread(target=interrupt_the_loop_thread, daemon=True).start()
        try:
            with session(session_id, CMD, wait=120):
                say("granted")
        except KeyboardInterrupt:
            say("interrupted", [child.pid for child in psutil.Process().children()])
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
            say("signals", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        say("released", run.running, gone(run.pid))
    elif scenario == "data":
        async with asession(session_id, CMD, provider="codex") as run:
            records = aiter(run.watch())
            first = await anext(records)
            say("watched", first.fence, first.status, first.holder is not None)
            await run.put("k", b"v1")
            say("got", (await run.get("k")).value, (await run.record_handle("thread-1")).resume_handle)
            changed = await anext(records)
            say("changed", changed.provider_handles, changed.provider)
    elif scenario == "forward":
        async with asession(session_id, CMD, forward_signals=True) as run:
            say("held", run.fence)
            say("status", await run.wait())
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
