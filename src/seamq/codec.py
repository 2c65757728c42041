"""JSON as the job server reads and writes it, and the consumer's HTTP requests are written: orjson,
which on a hot path (a job record encoded at each change, a body read and an answer written per
request; an envelope per handler call) costs a fifth of the standard library, with the standard
library where orjson would not give the same value back.

What is read is what the standard library reads, less NaN, Infinity and numbers beyond a double:
they are not JSON (RFC 8259), and a job holding one was written back as `NaN`, which no client's
parser reads. An integer of 19 digits or more is read by the standard library, exactly:
orjson would read one beyond 64 bits (or below a signed 64-bit's least, -2**63, which has 19
digits) as a float and change a user's args without a word. What
orjson cannot write (an integer beyond 64 bits, a lone surrogate) is written by the standard
library, with ASCII escapes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import orjson

_LONG_INTEGER = re.compile(rb"\d{19}")


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:30]} is beyond a double")
    return number


def loads(data: bytes, *, strict: bool = True) -> Any:
    """`strict` (the job server's bodies): NaN, Infinity and numbers beyond a double refused. Not
    strict (a message's payload, the producer's and not ours to refuse): exactly what json.loads reads."""
    if _LONG_INTEGER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # not JSON; or a BOM, UTF-16 or a lone surrogate, which json reads
            pass
    return json.loads(data, parse_constant=_refuse, parse_float=_finite) if strict else json.loads(data)


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact UTF-8 JSON; `default` writes what JSON has no type for, as json.dumps's does."""
    try:
        return orjson.dumps(value, default=default)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), default=default).encode()
