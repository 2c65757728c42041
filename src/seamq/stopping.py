"""Waiting that a stop cuts short: every worker loop sleeps through these helpers.

Python 3.11's `asyncio.wait_for` loses a cancellation that arrives as the
awaited event is set (fixed in 3.12): a loop that waited that way went on
waiting after its task was cancelled, and hung a server's shutdown (seen in
the job engine's deadline loop). `asyncio.timeout` does not.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `event` is set, at most `seconds` (None: no limit). True if it was set."""
    if seconds is None:
        await event.wait()
        return True
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            await event.wait()
        return True
    except TimeoutError:
        return False


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; return at once when `stop` is set. True if it was stopped."""
    return await wait_event(stop, seconds)
