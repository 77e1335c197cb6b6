"""Bounded retries of one awaitable call, for the client's and the coordinator's RPCs.

Guarantee: the call is tried again only while `retryable` says so of the exception it raised, and
never after `attempts` tries or once `budget_s` has passed since the first; then that exception is
raised as it was. Waits double from `first_wait_s` up to `max_wait_s`. Whether a retry is *safe*
(the first try may have landed) is the caller's to decide through `retryable`; this only bounds it.
Replaces tenacity, whose import alone cost `holdfast run` about 4 ms before its first RPC.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def retrying(call: Callable[[], Awaitable[T]], retryable: Callable[[BaseException], bool], *,
                   budget_s: float, attempts: int = 0, first_wait_s: float = 0.05,
                   max_wait_s: float = 1.0) -> T:
    """`call()`'s result; `attempts` 0 bounds the tries by `budget_s` alone."""
    started = time.monotonic()
    wait = first_wait_s
    tried = 0
    while True:
        tried += 1
        try:
            return await call()
        except Exception as exc:
            out_of_tries = attempts > 0 and tried >= attempts
            if out_of_tries or not retryable(exc) or time.monotonic() - started >= budget_s:
                raise
        await asyncio.sleep(wait)
        wait = min(wait * 2, max_wait_s)
