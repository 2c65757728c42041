"""Per-key rate limits of jobs (OJS rate limiting: `options.rate_limit` with a `key`): the policy a
job names, and the partition record its key's jobs share, decided here without I/O
(seamq.jobs.limiter stores it by compare-and-set, so every server decides on the same record).

A partition holds a permit per running job (its id and the attempt it was claimed as), the starts
of the last window and the throttle's next start. A permit is taken before its job's claim is
stored and given back after the job's end is stored, so the jobs running under a key are always
among its permits: a concurrency limit is never passed, whatever races or dies. A permit whose job
did not take it up or moved on (a server killed between the two writes) is dropped when the key is
full and its job's record says so (`stale`). Windows: up to SLIDING_MOST starts per period, a
sliding log (at most `limit` starts in any period); beyond, fixed windows aligned on the period
(up to twice the limit across a boundary), as the spec asks implementations to say.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

Record = dict[str, Any]  # a partition as stored

KEY_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._:-]{0,254}$")
ON_LIMIT = ("wait", "reschedule", "drop")
SLIDING_MOST = 1000  # starts kept in a partition's log; larger windows count in fixed windows
PERIOD_WORDS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
ISO_PERIOD = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")
CONCURRENCY_WAIT_MS = 250  # a job held back is looked at again after this at first, doubling with each look to
CONCURRENCY_WAIT_MOST_MS = 2000  # this on a full key (a permit may come back at any moment),
LOOK_MOST_MS = 5000  # this on a window or a throttle (each look costs NATS a take and a hold)
SPREAD_MS = 1000  # the jobs waiting on a key come back spread over at most this
CROWD_SPREAD_MOST_MS = 60_000  # ... or, a crowd waiting on a window or a throttle, over at most this
GRACE_MS = 30_000  # a permit whose claim is not stored within this is not on its way (ports.TAKEN_HOLD)


class Window(NamedTuple):
    limit: int
    period: float  # seconds

    @property
    def per_second(self) -> float:
        return self.limit / self.period

    def public(self) -> Record:
        return {"limit": self.limit, "period": _iso(self.period)}


@dataclass(frozen=True)
class Policy:
    key: str
    concurrency: int | None = None
    rate: Window | None = None
    throttle: Window | None = None
    on_limit: str = "wait"

    def public(self) -> Record:
        return {"key": self.key, "concurrency": self.concurrency, "rate": self.rate and self.rate.public(),
                "throttle": self.throttle and self.throttle.public(), "on_limit": self.on_limit}


class Verdict(NamedTuple):
    """What a partition says of a job's start: `wait_ms` 0 and the partition with its permit, or how
    long until the limit that stopped it may allow it (`strategy`: which one, at `limit`, `current`)."""

    wait_ms: int
    partition: Record
    strategy: str | None = None
    limit: int = 0
    current: int = 0
    key: str = ""
    on_limit: str = "wait"
    at_ms: int = 0  # the start its key counts: never before one it counted already
    per_second: float = 0.0  # starts a window or a throttle lets through (0: a concurrency limit, a pause)
    crowd: int = 0  # the jobs this server held back on the key lately (seamq.jobs.limiter)

    def told(self) -> Record:
        """The `rate_limit.exceeded` event's data."""
        return {"key": self.key, "strategy": self.strategy, "limit": self.limit, "current": self.current,
                "on_limit": self.on_limit, "wait_ms": self.wait_ms}

    def held_for(self, looks: int, rng: random.Random) -> float:
        """Seconds a job held back waits before it is looked at again (`looks`: how often it was):
        spread, so that the jobs waiting on a key do not all come back at the moment it frees one.
        A crowd on a window or a throttle is spread over the time it needs to start at the key's
        rate, so that it comes back about as often as the key lets jobs start, whatever its size:
        each look costs a take and a hold, and a crowd looked at faster than the servers can look
        holds up every other job of its queue (an entry that comes again is taken before any new
        one), for as long as the crowd is large on a slow machine (47 s once in CI)."""
        most = CONCURRENCY_WAIT_MOST_MS if self.strategy == "concurrency" else LOOK_MOST_MS
        wait = max(self.wait_ms, min(most, CONCURRENCY_WAIT_MS * 2 ** min(looks - 1, 8)))
        spread = min(wait, SPREAD_MS)
        if self.per_second:
            spread = max(spread, min(CROWD_SPREAD_MOST_MS, 1000 * self.crowd / self.per_second))
        return float(wait + rng.uniform(0, spread)) / 1000

    def refusal(self) -> Record:
        """The error of a job dropped by its key (`on_limit: drop`)."""
        return {"code": "rate_limited", "type": "RateLimited", "retryable": False, "message": f"rate limit key "
                f"{self.key!r} was at its {self.strategy} limit ({self.current} of {self.limit}) and the job's "
                "policy says drop", "details": self.told()}


def problem(value: Any) -> str | None:
    """Why `options.rate_limit` cannot be taken; None when it can (or is absent). A limit without a
    `key` is the queue's (`max_per_second`, seamq.jobs.queues)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "options.rate_limit must be an object"
    if "key" not in value:
        rate = value.get("max_per_second")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            return "options.rate_limit needs a key (a partition shared by the jobs naming it), or max_per_second " \
                   "(a positive number: the queue's rate)"
        return None
    try:
        policy_of(value)
    except ValueError as exc:
        return f"options.rate_limit.{exc}"
    return None


def policy_of(value: Any) -> Policy | None:
    """The per-key policy of `options.rate_limit`, None for none (or a queue's rate only). Both forms
    are taken: the spec's `rate: {limit, period: "PT1M"}` and the suite's `rate: 1, period: "second"`."""
    if not isinstance(value, dict) or "key" not in value:
        return None
    key = value["key"]
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"key must match {KEY_PATTERN.pattern}")
    concurrency = value.get("concurrency")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0):
        raise ValueError("concurrency must be an integer of 0 or more (0 holds every job of the key)")
    rate = value.get("rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        rate = {"limit": rate, "period": value.get("period", "second")}
    on_limit = value.get("on_limit", "wait")
    if on_limit not in ON_LIMIT:
        raise ValueError(f"on_limit must be one of {', '.join(ON_LIMIT)}")
    policy = Policy(key, concurrency, _window(rate, "rate"), _window(value.get("throttle"), "throttle"), on_limit)
    if policy.concurrency is None and policy.rate is None and policy.throttle is None:
        raise ValueError("names no limit: give concurrency, rate or throttle")
    return policy


def record_key(key: str) -> str:
    """The partition's record: a key's `:` is `=` (NATS keys have no `:`, and a limit key no `=`)."""
    return "rl." + key.replace(":", "=")


def admit(policy: Policy, partition: Record | None, job_id: str, attempt: int, now_ms: int) -> Verdict:
    """Whether the job may start its `attempt` now under its key's partition; if so, with its permit."""
    # Servers decide on clocks read a moment apart: a start is counted no earlier than the latest one
    # counted, so the starts are stored in the order of their times, and a window trimmed by one
    # decision holds every start that a later one must count (at most `limit` in any period).
    now_ms = max(now_ms, *((partition or {}).get("starts") or [0]), (partition or {}).get("window_last_ms", 0))
    return _admit(policy, partition, job_id, attempt, now_ms)._replace(key=policy.key, on_limit=policy.on_limit,
                                                                        at_ms=now_ms)


def _admit(policy: Policy, partition: Record | None, job_id: str, attempt: int, now_ms: int) -> Verdict:
    held = dict(partition or {"_kind": "rate_limit", "key": policy.key})
    held["policy"] = policy.public()
    active = {k: v for k, v in (held.get("active") or {}).items() if k != job_id}
    concurrency = _concurrency(held, policy.concurrency, now_ms)
    if concurrency is not None and len(active) >= concurrency:
        return Verdict(CONCURRENCY_WAIT_MS, held, "concurrency", concurrency, len(active))
    if (until := held.get("paused_until_ms", 0)) > now_ms:  # a handler's rate_limit_until
        return Verdict(until - now_ms, held, "dynamic", 0, 0)
    starts, window = held.get("starts") or [], held.get("window") or [0, 0]
    if policy.rate is not None:
        period_ms = int(policy.rate.period * 1000)
        if policy.rate.limit <= SLIDING_MOST:
            starts = sorted(t for t in starts if t > now_ms - period_ms)[-policy.rate.limit:]  # servers' starts interleave
            if len(starts) >= policy.rate.limit:
                return Verdict(max(1, starts[0] + period_ms - now_ms), held, "rate", policy.rate.limit, len(starts),
                               per_second=policy.rate.per_second)
            starts = [*starts, now_ms]
        else:
            if now_ms // period_ms * period_ms != window[0]:
                window = [now_ms // period_ms * period_ms, 0]
            if window[1] >= policy.rate.limit:
                return Verdict(window[0] + period_ms - now_ms, held, "rate", policy.rate.limit, window[1],
                               per_second=policy.rate.per_second)
            window = [window[0], window[1] + 1]
            held["window_last_ms"] = now_ms
    next_ms = held.get("next_ms", 0)
    if policy.throttle is not None:
        if next_ms > now_ms:
            return Verdict(next_ms - now_ms, held, "throttle", policy.throttle.limit, 1,
                           per_second=policy.throttle.per_second)
        next_ms = now_ms + int(policy.throttle.period * 1000 / policy.throttle.limit)
    permits = {**active, job_id: [attempt, now_ms]} if concurrency is not None else active  # none kept without a limit
    return Verdict(0, {**held, "active": permits, "starts": starts,
                       "window": window, "next_ms": next_ms})


def released(partition: Record, job_id: str, attempt: int) -> Record | None:
    """The partition without the job's permit once its `attempt` ended; None if it holds none for it."""
    permit = (partition.get("active") or {}).get(job_id)
    if permit is None or permit[0] > attempt:
        return None
    return {**partition, "active": {k: v for k, v in partition["active"].items() if k != job_id}}


def stale(partition: Record, records: dict[str, Record], now_ms: int) -> list[str]:
    """Permits whose jobs are not running them, by their records as stored: gone, on a later attempt,
    or ended the attempt (its release lost with a server), or never claimed it within GRACE_MS."""
    out = []
    for job_id, (attempt, at) in (partition.get("active") or {}).items():
        record = records.get(job_id)
        if record is None or record["attempt"] > attempt or (record["attempt"] == attempt and record["state"] != "active") \
                or (record["attempt"] < attempt and at < now_ms - GRACE_MS):
            out.append(job_id)
    return out


def public(partition: Record, now_ms: int) -> Record:
    """GET /rate-limits/{key}: the partition as it stands."""
    policy = partition.get("policy") or {}
    out: dict[str, Any] = {"key": partition["key"], "on_limit": policy.get("on_limit", "wait")}
    active = len(partition.get("active") or {})
    limit = _concurrency(partition, policy.get("concurrency"), now_ms)
    if limit is not None:
        out["concurrency"] = {"limit": limit, "active": active, "available": max(0, limit - active)}
    if (rate := policy.get("rate")) is not None:
        period_ms = int((_seconds(rate["period"]) or 1.0) * 1000)
        starts = sorted(t for t in partition.get("starts") or [] if t > now_ms - period_ms)
        window = partition.get("window") or [0, 0]
        count, resets = (len(starts), (starts[0] + period_ms) if starts else now_ms) if rate["limit"] <= SLIDING_MOST \
            else (window[1] if window[0] + period_ms > now_ms else 0, now_ms // period_ms * period_ms + period_ms)
        out["rate"] = {**rate, "current_count": count, "remaining": max(0, rate["limit"] - count), "window_resets_at_ms": resets}
    if (throttle := policy.get("throttle")) is not None:
        out["throttle"] = {**throttle, "next_allowed_at_ms": max(now_ms, partition.get("next_ms", 0))}
    return out


def moment(ms: int) -> datetime:
    """A partition's time (whole milliseconds since 1970, as a job's times are written) as a datetime."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)


def headers(policy: Policy, partition: Record | None, now_ms: int) -> dict[str, str]:
    """X-RateLimit-Limit, -Remaining and -Reset (Unix seconds) of a job's key, for its enqueue's answer:
    its window if it has one, else its throttle, else its concurrency."""
    view = public({"key": policy.key, **(partition or {}), "policy": policy.public()}, now_ms)
    if "rate" in view:
        limit, left, reset = view["rate"]["limit"], view["rate"]["remaining"], view["rate"]["window_resets_at_ms"]
    elif "throttle" in view:
        at = view["throttle"]["next_allowed_at_ms"]
        limit, left, reset = view["throttle"]["limit"], int(at <= now_ms), at
    else:
        limit, left = view["concurrency"]["limit"], view["concurrency"]["available"]
        reset = now_ms + (0 if left else CONCURRENCY_WAIT_MS)
    return {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(left), "X-RateLimit-Reset": str(-(-reset // 1000))}


def _concurrency(partition: Record, named: int | None, now_ms: int) -> int | None:
    """The key's concurrency: an override set by hand (PUT /rate-limits/{key}) until it ends, else the job's."""
    override = partition.get("override") or {}
    if "concurrency" not in override or 0 < override.get("until_ms", 0) <= now_ms:
        return named
    return int(override["concurrency"])


def _window(value: Any, name: str) -> Window | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object {{limit, period}}")
    limit = value.get("limit")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{name}.limit must be a positive integer")
    period = _seconds(value.get("period"))
    if period is None or not 0.001 <= period <= 366 * 86400:
        raise ValueError(f"{name}.period must be an ISO 8601 duration such as PT1S or PT1M (or second, minute, "
                         "hour, day), from 1 ms to a year")
    return Window(limit, period)


def _seconds(text: Any) -> float | None:
    if text in PERIOD_WORDS:
        return PERIOD_WORDS[text]
    found = ISO_PERIOD.fullmatch(text) if isinstance(text, str) and text not in ("P", "PT") and not text.endswith("T") else None
    if found is None:
        return None
    d, h, m, s = (float(part) if part else 0.0 for part in found.groups())
    return d * 86400 + h * 3600 + m * 60 + s


def _iso(seconds: float) -> str:
    return f"PT{seconds:g}S" if seconds < 60 or seconds % 60 else f"PT{seconds / 60:g}M" if seconds < 3600 or seconds % 3600 \
        else f"PT{seconds / 3600:g}H"
