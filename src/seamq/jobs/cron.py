"""Cron expressions: parse the five-field form and the `@daily` shorthands, find the next run. No I/O.

The engine fires a cron by arming a timer at `next_after(...)`; NATS's own cron
schedules take six fields and no time zones, so the arithmetic is done here,
in the cron's zone (a wall-clock time that a DST change skips is skipped, one
that it repeats fires once).
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from seamq.jobs import model
from seamq.jobs.model import OjsError

SHORTHANDS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, MONTHS),
          ("day of week", 0, 7, DAYS))
SEARCH_DAYS = 366 * 5  # `0 0 29 2 1` runs on a Monday 29 February: a few years out at most


def invalid(message: str) -> OjsError:
    return OjsError(400, "invalid_request", message)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is `*`
    any_weekday: bool

    def day_matches(self, day: datetime) -> bool:
        """Classic cron: when both day fields are restricted, either one matching is enough."""
        by_date, by_weekday = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday

    def next_after(self, moment: datetime, zone: str = "UTC") -> datetime:
        """The first run strictly after `moment`, as an aware UTC datetime."""
        tz = time_zone(zone)
        local = moment.astimezone(tz).replace(second=0, microsecond=0, tzinfo=None) + timedelta(minutes=1)
        day = local.replace(hour=0, minute=0)
        for _ in range(SEARCH_DAYS):
            if day.month in self.months and self.day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        wall = day.replace(hour=hour, minute=minute)
                        if wall < local:
                            continue
                        found = _real(wall, tz)
                        if found is not None:
                            return found
            day += timedelta(days=1)
        raise invalid("the cron expression never matches a real date")


def _real(wall: datetime, tz: ZoneInfo) -> datetime | None:
    """The UTC moment of a wall-clock time, or None if the zone skips it (a DST gap)."""
    aware = wall.replace(tzinfo=tz)
    back = aware.astimezone(timezone.utc).astimezone(tz).replace(tzinfo=None)
    return aware.astimezone(timezone.utc) if back == wall else None


def time_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise invalid(f"unknown time zone {name!r}: use an IANA name such as Europe/Paris or UTC") from None


def parse(expression: object) -> Cron:
    if not isinstance(expression, str) or not expression.strip():
        raise invalid("expression is required: five fields such as '*/5 * * * *', or @hourly, @daily, ...")
    text = SHORTHANDS.get(expression.strip().lower(), expression.strip())
    parts = text.split()
    if len(parts) != 5:
        raise invalid(f"cron expression {expression!r} has {len(parts)} fields; it needs 5 "
                      "(minute hour day-of-month month day-of-week) or a shorthand such as @daily")
    values = [_field(part, *spec) for part, spec in zip(parts, FIELDS)]
    weekdays = frozenset(d % 7 for d in values[4])  # 7 is Sunday too
    minutes, hours, days, months = (frozenset(v) for v in values[:4])
    return Cron(minutes, hours, days, months, weekdays, any_day=parts[2] == "*", any_weekday=parts[4] == "*")


def _field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    found: set[int] = set()
    for item in text.lower().split(","):
        spec, _, step_text = item.partition("/")
        step = _number(step_text, name, names={}) if step_text else 1
        if step < 1:
            raise invalid(f"the {name} step in {text!r} must be at least 1")
        if spec == "*":
            first, last = low, high
        elif "-" in spec:
            first, last = (_number(x, name, names) for x in spec.split("-", 1))
        else:
            first = _number(spec, name, names)
            last = high if step_text else first
        if not (low <= first <= high and low <= last <= high) or first > last:
            raise invalid(f"{name} {item!r} is outside {low}-{high}")
        found.update(range(first, last + 1, step))
    return found


def _number(text: str, name: str, names: dict[str, int]) -> int:
    if text in names:
        return names[text]
    if not text.isdigit():
        raise invalid(f"{name} {text!r} is not a number" + (f" or a name ({', '.join(names)})" if names else ""))
    return int(text)


def key(name: str) -> str:
    return f"cron.{name.encode().hex()}"


def _one_of(body: dict[str, Any], names: tuple[str, str], what: str) -> object:
    """The suite names it one way, the SDKs another: either, but not two that disagree."""
    given = [body[n] for n in names if body.get(n) is not None]
    if len(given) == 2 and given[0] != given[1]:
        raise invalid(f"{names[0]} and {names[1]} both give the {what} and differ: send one")
    return given[0] if given else None


def new(body: object, now: datetime) -> dict[str, Any]:
    """A validated cron record from `POST /cron`: the suite's `{name, expression, job_template}` or
    the SDKs' `{name, cron, type, args, options, meta}`."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or not name or len(name) > 200:
        raise invalid("name is required: a string of at most 200 characters")
    expression = _one_of(body, ("expression", "cron"), "cron expression")
    zone = body.get("timezone") or "UTC"
    schedule = parse(expression)
    time_zone(zone)
    policy = body.get("overlap_policy", "allow")
    if policy not in ("allow", "skip"):
        raise invalid("overlap_policy must be allow or skip")
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false")
    template = body.get("job_template")
    if template is not None and body.get("type") is not None:
        raise invalid("give the job either as job_template or as type and args, not both")
    if template is None and body.get("type") is not None:
        template = {k: body[k] for k in ("type", "args", "options", "meta") if body.get(k) is not None}
        template.setdefault("args", [])
    if template is None:
        raise invalid("the job to enqueue is required: job_template, or type and args")
    model.new_record(template, now)  # refused now, not at the first fire
    return {"_key": key(name), "_kind": "cron", "name": name, "expression": expression, "timezone": zone,
            "overlap_policy": policy, "enabled": enabled, "created_at": model.iso(now),
            "next_run_at": model.iso(schedule.next_after(now, zone)), "job_template": template}


def public(record: dict[str, Any]) -> dict[str, Any]:
    """The record as both shapes read it: the suite's fields and the SDKs' (`cron`, `type`, `args`,
    `options`, `status`)."""
    template = record.get("job_template") or {}
    shown = {k: v for k, v in record.items() if not k.startswith("_") and v is not None}
    return {**shown, "cron": record["expression"], "type": template.get("type"), "args": template.get("args", []),
            **({"options": template["options"]} if template.get("options") else {}),
            "status": "active" if record.get("enabled", True) else "paused"}
