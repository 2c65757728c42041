"""Time-ordered ids (UUIDv7, RFC 9562) for everything seamq names: events, jobs, workflows.

A random UUIDv4 primary key puts every insert on a random page of its index, which, once the index
outgrows memory, is a page read per insert; a UUIDv7 begins with its time, so inserts append, and
an id tells when it was made. Python 3.11 has no uuid7.
"""

from __future__ import annotations

import os
import time
import uuid

_LAST = [0, 0]  # the last id's milliseconds and 12-bit sequence, for ids that sort as they were made


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """48-bit Unix milliseconds, version 7, a 12-bit sequence (RFC 9562 method 1: random start,
    counted up within a millisecond, so ids made in one process sort in the order made), variant
    10, 62 random bits."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    seq = int.from_bytes(os.urandom(2), "big") & 0x7FF  # room to count up
    if now_ms is None:
        if ms <= _LAST[0]:
            ms, seq = _LAST[0], _LAST[1] + 1
            if seq > 0xFFF:  # 4,096 in one millisecond: borrow the next one
                ms, seq = ms + 1, 0
        _LAST[:] = [ms, seq]
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | (
        int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1))
    return uuid.UUID(int=value)
