"""The bounds of holdfast.common.retry: pure logic, no I/O but the waits themselves."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.common.retry import retrying


class Flaky:
    """Fails with `error` for the first `failures` calls, then answers "ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_retryable_failure_is_tried_again_until_it_answers() -> None:
    call = Flaky(3, ConnectionError("down"))
    assert run(retrying(call, lambda _exc: True, budget_s=5.0, first_wait_s=0.001)) == "ok"
    assert call.calls == 4


def test_a_failure_that_is_not_retryable_is_raised_after_one_try() -> None:
    call = Flaky(3, ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        run(retrying(call, lambda exc: isinstance(exc, ConnectionError), budget_s=5.0, first_wait_s=0.001))
    assert call.calls == 1


def test_attempts_bound_the_tries_and_the_last_error_is_raised_as_it_was() -> None:
    error = ConnectionError("still down")
    call = Flaky(10, error)
    with pytest.raises(ConnectionError) as raised:
        run(retrying(call, lambda _exc: True, budget_s=5.0, attempts=4, first_wait_s=0.001))
    assert raised.value is error
    assert call.calls == 4


def test_a_spent_budget_stops_the_retries() -> None:
    call = Flaky(10, ConnectionError("down"))
    with pytest.raises(ConnectionError):
        run(retrying(call, lambda _exc: True, budget_s=0.0, first_wait_s=0.001))
    assert call.calls == 1


def test_waits_double_up_to_their_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    call = retrying(Flaky(5, ConnectionError()), lambda _exc: True, budget_s=5.0, first_wait_s=0.05,
                    max_wait_s=0.3)
    assert run(call) == "ok"
    assert waits == [0.05, 0.1, 0.2, 0.3, 0.3]
