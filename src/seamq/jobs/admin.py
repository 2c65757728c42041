"""The admin extension's rules (`urn:ojs:ext:admin-api`), with no I/O: which jobs a filter selects,
how a job is summed up in a list and shown in detail, and how a list is paged.

One `Filter` serves the job list, the dead-letter list and the bulk actions, so
"what the operator saw" and "what a bulk retry acts on" cannot drift apart.
A filter the server does not understand (an unknown state, a time that is not
RFC 3339, a field it does not know) is refused with 400, never read as "all".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from seamq.jobs.model import STATES, invalid, parse_time, public

FILTER_FIELDS = ("queue", "state", "type", "since", "until", "id")
SORTS = ("created_at", "scheduled_at", "priority")
PER_PAGE, MOST_PER_PAGE = 20, 100
TIMES = ("created_at", "enqueued_at", "started_at", "scheduled_at", "completed_at", "cancelled_at", "discarded_at")


@dataclass(frozen=True)
class Filter:
    queue: str | None = None
    state: str | None = None
    type: str | None = None  # exact, or a prefix ending in `*`
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    id: str | None = None  # a job id, or its start (people copy ids as tables show them, cut)

    @classmethod
    def of(cls, given: Any, *, strict: bool = True) -> "Filter":
        """From query parameters (strict=False: other parameters such as `page` pass) or a bulk
        action's `filter` object (strict: an unknown field is an error, not ignored)."""
        if given is None:
            return cls()
        if not isinstance(given, Mapping):
            raise invalid("filter must be an object with any of: " + ", ".join(FILTER_FIELDS))
        unknown = sorted(set(given) - set(FILTER_FIELDS))
        if strict and unknown:
            raise invalid(f"filter: unknown field {unknown[0]!r}; known: {', '.join(FILTER_FIELDS)}")
        values: dict[str, Any] = {}
        for name in ("queue", "state", "type", "id"):
            value = given.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise invalid(f"filter: {name} must be a non-empty string")
            values[name] = value or None
        if values["state"] is not None and values["state"] not in STATES:
            raise invalid(f"filter: state {values['state']!r} is not one of {', '.join(STATES)}")
        for name in ("since", "until"):
            value = given.get(name)
            if value in (None, ""):
                values[name] = None
                continue
            try:
                values[name] = parse_time(value)
            except (TypeError, ValueError):
                raise invalid(f"filter: {name} must be an RFC 3339 time such as 2026-01-31T12:00:00Z") from None
        return cls(**values)

    def matches(self, record: dict[str, Any]) -> bool:
        if self.id is not None and not str(record.get("id", "")).startswith(self.id.lower()):
            return False
        if self.queue is not None and record.get("queue") != self.queue:
            return False
        if self.state is not None and record.get("state") != self.state:
            return False
        if self.type is not None:
            job_type = record.get("type") or ""
            if self.type.endswith("*"):
                if not job_type.startswith(self.type[:-1]):
                    return False
            elif job_type != self.type:
                return False
        if self.since is not None or self.until is not None:
            created = parse_time(record["created_at"])
            if (self.since is not None and created < self.since) or (self.until is not None and created >= self.until):
                return False
        return True

    def select(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if self.matches(r)]


def confirmed(body: dict[str, Any]) -> None:
    """Destructive and bulk actions act only with `confirm: true` (admin API §4, §6.5, §8)."""
    if body.get("confirm") is not True:
        raise invalid("this action changes many jobs: send \"confirm\": true to carry it out")


def sort(records: list[dict[str, Any]], by: str | None, order: str | None) -> list[dict[str, Any]]:
    by, order = by or "created_at", order or "desc"
    if by not in SORTS:
        raise invalid(f"sort must be one of {', '.join(SORTS)}")
    if order not in ("asc", "desc"):
        raise invalid("order must be asc or desc")
    key = (lambda r: (r.get("priority") or 0, r["created_at"])) if by == "priority" else \
        (lambda r: (r.get(by) or "", r["id"]))
    return sorted(records, key=key, reverse=order == "desc")


def _positive(text: str | None, name: str, default: int) -> int:
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise invalid(f"{name} {text!r} is not an integer") from None
    if value < 1:
        raise invalid(f"{name} must be at least 1")
    return value


def paged(items: list[Any], params: Mapping[str, str]) -> dict[str, Any]:
    """`{items, pagination: {total, page, per_page}}`; `per_page` above the most is the most."""
    page = _positive(params.get("page"), "page", 1)
    per_page = min(_positive(params.get("per_page"), "per_page", PER_PAGE), MOST_PER_PAGE)
    start = (page - 1) * per_page
    return {"items": items[start:start + per_page],
            "pagination": {"total": len(items), "page": page, "per_page": per_page}}


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """A job as one row of a list."""
    row = {k: record[k] for k in ("id", "type", "queue", "state", "priority", "attempt", "max_attempts")}
    row.update({k: record[k] for k in TIMES if record.get(k)})
    if record.get("error"):
        row["error"] = {k: v for k, v in record["error"].items() if k in ("code", "type", "message")}
    return row


def detail(record: dict[str, Any]) -> dict[str, Any]:
    """The whole envelope, with the admin API's extras: `errors` always a list (each trace as
    `backtrace` lines), `retry_policy`, `metadata` with the job's moments, and `dead_letter`: whether
    it waits in the dead letters (discarded with on_exhaustion: dead_letter)."""
    job = public(record)
    job["dead_letter"] = bool(record.get("_dlq"))
    job["errors"] = [_with_backtrace(e) for e in record.get("errors") or []]
    job["meta"] = record.get("meta") or {}
    job["retry_policy"] = record.get("retry") or {"max_attempts": record["max_attempts"]}
    job["metadata"] = {k: record.get(k) for k in TIMES}
    return job


def _with_backtrace(error: dict[str, Any]) -> dict[str, Any]:
    details = error.get("details")
    if not isinstance(details, dict):
        details = {}
    trace = details.get("traceback") or details.get("stack")
    if isinstance(trace, str) and trace.strip():
        return {**error, "backtrace": trace.rstrip().splitlines()}
    return error


def dead_letter_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_queue: dict[str, int] = {}
    by_type: dict[str, int] = {}
    for record in records:
        by_queue[record["queue"]] = by_queue.get(record["queue"], 0) + 1
        kind = (record.get("error") or {}).get("type") or "unknown"
        by_type[kind] = by_type.get(kind, 0) + 1
    ended = sorted(r.get("discarded_at") or r["created_at"] for r in records)
    stats: dict[str, Any] = {"total": len(records), "by_queue": by_queue, "by_error_type": by_type}
    if ended:
        stats.update(oldest_at=ended[0], newest_at=ended[-1])
    return stats


def bulk_result(action: str, matched: int, errors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "matched": matched, "succeeded": matched - len(errors), "failed": len(errors),
            "errors": errors}
