"""Waits that a stop or a cancellation cuts short (seamq.stopping), without a server."""

from __future__ import annotations

import asyncio

import pytest

from seamq.stopping import sleep_unless_stopped, wait_event


async def test_a_cancellation_that_meets_the_event_is_never_lost():
    """Python 3.11's wait_for returned normally when its task was cancelled as the event was set, so a
    loop around it waited on, and the job server hung at shutdown."""
    event = asyncio.Event()

    async def loop():
        while True:
            event.clear()
            await wait_event(event, 3600)

    for _ in range(20):
        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        event.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


async def test_waits_end_on_the_event_or_the_time():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 30) is True and await wait_event(event, None) is True
    assert await sleep_unless_stopped(event, 30) is True
