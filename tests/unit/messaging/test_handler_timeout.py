"""The in-process handler timeout (seamq.inprocess.timeout): one timer per task, not per call."""

from __future__ import annotations

import asyncio
import time

import pytest

from seamq.envelope import HandlerResult, Outcome
from seamq.inprocess import timeout

OK = HandlerResult(Outcome.OK)


def handler(delay: float, swallow: bool = False):
    async def fn(envelope, conn):
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            if not swallow:
                raise
        return OK
    return fn


async def test_an_overrunning_call_is_a_retry_and_the_task_goes_on():
    slow = timeout(0.05, handler(1.0))
    result = await slow(None, None)
    assert (result.outcome, result.detail) == (Outcome.RETRY, "handler timed out after 0.05s")
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0.1)  # nothing left armed to cancel us later
    assert await timeout(0.05, handler(0))(None, None) == OK


async def timed(call) -> tuple[HandlerResult, float]:
    started = time.monotonic()
    result = await call(None, None)
    return result, time.monotonic() - started


async def test_many_fast_calls_are_never_cancelled_even_across_the_timer():
    """A call that ends well within its own time is never cancelled by a deadline armed for an earlier
    call. On a busy machine a 1 ms sleep can truly take 50 ms: such a call may time out, by right."""
    fast = timeout(0.05, handler(0.001))
    began, judged = time.monotonic(), 0
    while time.monotonic() - began < 0.15 or judged < 100:  # past the one timer's first deadline
        result, took = await timed(fast)
        if took < 0.04:
            assert result == OK, f"cancelled after {took * 1000:.1f} ms of its 50"
            judged += 1
    await asyncio.sleep(0.12)  # idle past a deadline: not cancelled
    assert asyncio.current_task().cancelling() == 0


async def test_a_call_that_begins_late_gets_its_own_full_time():
    call = timeout(0.3, handler(0.2))
    first, took = await timed(call)  # arms the timer at +0.3
    second, took_second = await timed(call)  # began at ~0.2, runs to ~0.4: past the first deadline, inside its own
    if took < 0.25 and took_second < 0.25:  # else the machine was too slow for either to fit its time
        assert first == second == OK


async def test_a_handler_that_swallows_the_cancellation_returns_and_leaves_no_cancel_behind():
    result = await timeout(0.05, handler(0.5, swallow=True))(None, None)
    assert result == OK
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0.01)


async def test_a_shutdown_during_a_call_is_not_turned_into_a_timeout():
    task = asyncio.create_task(timeout(10, handler(1.0))(None, None))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
