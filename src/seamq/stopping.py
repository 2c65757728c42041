"""Waiting that a stop cuts short: every worker loop sleeps through this one helper."""

from __future__ import annotations

import asyncio


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; return at once when `stop` is set. True if it was stopped."""
    try:
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
        return True
    except asyncio.TimeoutError:
        return False
