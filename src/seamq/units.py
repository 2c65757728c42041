"""Durations and sizes as people write them in settings, topology files and command options
("500ms", "7d", "512MB"), and durations as people read them back."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"^(\d+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$")
_SIZE_UNITS = {
    None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}


def parse_duration(value: str | int | float) -> float:
    """'120s', '7d', '2m', or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like 500ms, 120s, 2m, 1h or 7d")
    return float(match[1]) * _DURATION_UNITS[match[2]]


def format_duration(seconds: float) -> str:
    """The inverse, for people: 604800 -> '7d', 120 -> '2m', 0.5 -> '500ms', 90 -> '90s'."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"


def parse_size(value: str | int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a size like 512MB or 10GB")
    return int(match[1]) * _SIZE_UNITS[match[2]]
