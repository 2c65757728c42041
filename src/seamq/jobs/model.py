"""The Open Job Spec job model: envelope validation, states, retry policy, records as stored. No I/O.

One job is one record: the public envelope (what `GET /ojs/v1/jobs/{id}` shows)
plus internal fields whose names start with `_` (lease, entry, dead letter).
What a state change does is seamq.jobs.job's; a failed attempt's report, seamq.jobs.attempts'.

Quirks of the conformance suite v0.4.0 absorbed here (shared/ojs/DESIGN-BRIEF.md
§1.8): job types may contain `-`; ids are lowercase UUIDv7 only; `options` are
flattened into the envelope (`priority`, `queue`, `max_attempts` at the top);
an absolute `expires_at` is echoed exactly as sent; `attempt` counts up at
fetch; `errors[].type` is derived when the client sends none.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Any

from seamq import codec, ids
from seamq.jobs import limits, tenants
from seamq.backoff import NO_JITTER, Backoff, Growth

Record = dict[str, Any]  # a job, a count or a workflow as stored: JSON


class State(StrEnum):
    """A job's state, OJS's seven: the one place they are written (a member is its string)."""
    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    ACTIVE = "active"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    CANCELLED = "cancelled"


STATES = tuple(State)
WAITING = frozenset({State.SCHEDULED, State.AVAILABLE, State.RETRYABLE})
FINISHED = frozenset({State.COMPLETED, State.DISCARDED, State.CANCELLED})

TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$")  # `-` allowed: 19 cases use it
QUEUE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9\-.]*$")
UUIDV7_PATTERN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

DURATION_PATTERN = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$")

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_VISIBILITY_MS = 1_800_000  # the worker protocol's 1800 s; L2-CRON-005 needs more than 65 s
MAX_BATCH = 1000  # records in one NATS atomic batch: the jobs and a count per queue (seamq.jobs.tally)
MAX_ARGS_BYTES = 512 * 1024  # a job's args; the record must fit one KV message with room to spare

# Fields the server owns: a client cannot set them in a push.
SYSTEM_FIELDS = frozenset({
    "state", "attempt", "created_at", "enqueued_at", "started_at", "completed_at", "cancelled_at", "discarded_at",
    "error", "errors", "result", "retry_delay_ms", "next_attempt_at", "worker_id", "workflow_id", "workflow_index",
    "parent_results", "checkpoint"})
CHECKPOINT = "_checkpoint"  # a job's checkpoint (seamq.jobs.checkpoints), shown as `checkpoint`


class OjsError(Exception):
    """An error with the OJS error body: {"error": {code, message, retryable, type, ...}}."""

    def __init__(self, status: int, code: str, message: str, *, type: str | None = None,
                 details: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.type = type or {400: "validation_error", 404: "not_found", 409: "conflict",
                             422: "validation_error"}.get(status, "server_error")
        self.details, self.headers = details, headers  # headers: what the answer carries besides (429's)

    def body(self, request_id: str | None = None) -> dict[str, Any]:
        retryable = self.status >= 500 and self.status != 501  # 501: asking again changes nothing
        error = {"code": self.code, "message": self.message, "retryable": retryable, "type": self.type}
        if self.details:
            error["details"] = self.details
        if self.status == 404:
            error["hint"] = "check the id; completed jobs are kept for the retention period only"
            error["docs_url"] = "https://openjobspec.org/spec/ojs-http-binding#errors"
        if request_id:
            error["request_id"] = request_id
        return {"error": error}


def invalid(message: str) -> OjsError:
    return OjsError(400, "invalid_request", message)


def conflict(message: str) -> OjsError:
    return OjsError(409, "conflict", message)


def not_found(job_id: str) -> OjsError:
    return OjsError(404, "not_found", f"job {job_id} not found")


# ---- time and ids ------------------------------------------------------------------------------

def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """RFC 3339, UTC, milliseconds, `Z` (isoformat: a third of strftime's time, on every record written)."""
    if moment.utcoffset():
        moment = moment.astimezone(timezone.utc)
    text = moment.isoformat(timespec="milliseconds")
    return text[:-6] + "Z" if moment.tzinfo else text + "Z"  # "+00:00" when aware


def parse_time(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)  # what this server writes: "Z" read since Python 3.11
    except (ValueError, TypeError):
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except (ValueError, AttributeError):
            raise invalid(f"{text!r} is not an RFC 3339 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def parse_duration(text: Any, what: str = "duration") -> float:
    """ISO 8601 duration (PT1S, PT5M, P1DT2H) -> seconds."""
    found = DURATION_PATTERN.fullmatch(text) if isinstance(text, str) and text not in ("P", "PT") else None
    if not found or text.endswith("T"):
        raise OjsError(422, "invalid_request", f"{what} {text!r} is not an ISO 8601 duration such as PT1S")
    parts = {k: float(v) if v else 0.0 for k, v in found.groupdict().items()}
    return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]


def resolve_time(text: Any, now: datetime, what: str) -> datetime:
    """An absolute RFC 3339 time, or `+PT2S` relative to now."""
    if not isinstance(text, str):
        raise invalid(f"options.{what} must be a string")
    if text.startswith("+"):
        try:
            return now + timedelta(seconds=parse_duration(text[1:], what))
        except OjsError as exc:
            raise invalid(exc.message) from None
    return parse_time(text)


def is_job_id(value: Any) -> bool:
    """An id this server could have given (a job's or a workflow's): anything else names nothing, unread."""
    return isinstance(value, str) and UUIDV7_PATTERN.fullmatch(value) is not None


def uuid7(now_ms: int | None = None) -> str:
    """A job's or a workflow's id: a UUIDv7 (seamq.ids), as text."""
    return str(ids.uuid7(now_ms))


# ---- retry policy ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_interval: float = 1.0  # seconds
    backoff_coefficient: float = 2.0
    max_interval: float = 300.0
    jitter: bool = True
    non_retryable_errors: tuple[str, ...] = ()
    on_exhaustion: str = "discard"  # or dead_letter
    backoff_strategy: str | None = None  # exponential (default) | linear | polynomial | none

    @classmethod
    def from_options(cls, retry: Any, max_attempts: Any = None) -> "RetryPolicy":
        """Validated (422, as L1-RTR-011/012 want) from `options.retry`."""
        if retry is None:
            retry = {}
        if not isinstance(retry, dict):
            raise OjsError(422, "invalid_request", "options.retry must be an object")
        attempts = retry.get("max_attempts", max_attempts if max_attempts is not None else DEFAULT_MAX_ATTEMPTS)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise OjsError(422, "invalid_request", f"retry.max_attempts must be an integer >= 0, got {attempts!r}")
        coefficient = retry.get("backoff_coefficient", 2.0)
        if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or coefficient < 1.0:
            raise OjsError(422, "invalid_request", f"retry.backoff_coefficient must be >= 1.0, got {coefficient!r}")
        jitter = retry.get("jitter", True)
        if not isinstance(jitter, bool):
            raise OjsError(422, "invalid_request", "retry.jitter must be true or false")
        errors = retry.get("non_retryable_errors", [])
        if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
            raise OjsError(422, "invalid_request", "retry.non_retryable_errors must be a list of strings")
        exhaustion = retry.get("on_exhaustion", "discard")
        if exhaustion not in ("discard", "dead_letter"):
            raise OjsError(422, "invalid_request", "retry.on_exhaustion must be discard or dead_letter")
        strategy = retry.get("backoff_strategy")
        if strategy not in (None, "exponential", "linear", "polynomial", "none"):
            raise OjsError(422, "invalid_request", f"retry.backoff_strategy {strategy!r} is not supported")
        return cls(
            max_attempts=attempts,
            initial_interval=parse_duration(retry.get("initial_interval", "PT1S"), "retry.initial_interval"),
            backoff_coefficient=float(coefficient),
            max_interval=parse_duration(retry.get("max_interval", "PT5M"), "retry.max_interval"),
            jitter=jitter, non_retryable_errors=tuple(errors), on_exhaustion=exhaustion, backoff_strategy=strategy,
        )

    @property
    def backoff(self) -> Backoff:
        """OJS's strategies as the house's policy: `none` waits the initial interval each time, and
        jitter draws from half to one and a half of the delay, within `max_interval`."""
        return Backoff(base=self.initial_interval, cap=self.max_interval, factor=self.backoff_coefficient,
                       growth=Growth.CONSTANT if self.backoff_strategy == "none"
                       else Growth(self.backoff_strategy or Growth.EXPONENTIAL),
                       spread=(0.5, 1.5) if self.jitter else NO_JITTER)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds before retry after failed attempt `attempt` (1-based)."""
        return self.backoff.delay(attempt, rng)

    def matches_non_retryable(self, names: list[str]) -> bool:
        """Exact, or prefix for `X.*` (L1-RTR-004/005)."""
        for pattern in self.non_retryable_errors:
            for name in names:
                if pattern == name or (pattern.endswith(".*") and name.startswith(pattern[:-1])):
                    return True
        return False


# ---- the envelope -------------------------------------------------------------------------------

# Set on every job by new_record and kept by every transition, and null more often than not:
# stored without them (a tenth of a waiting job's bytes, in KV and in the engine's memory).
NULLABLE = ("enqueued_at", "scheduled_at", "expires_at", "timeout_ms", "tags", "retry", "unique", "options")


def check_queue(queue: Any, what: str = "queue") -> str:
    """A queue name is also part of NATS keys and subjects: nothing outside the pattern gets in."""
    if not isinstance(queue, str) or len(queue) > 255 or not QUEUE_PATTERN.fullmatch(queue):
        raise invalid(f"{what} {queue!r} must match {QUEUE_PATTERN.pattern}")
    return queue


def check_fetch(queues: Any, count: Any) -> None:
    if not isinstance(queues, list) or not queues or not all(isinstance(q, str) for q in queues):
        raise invalid("queues must be a non-empty list of queue names")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_BATCH:
        raise invalid(f"count must be an integer from 1 to {MAX_BATCH}")
    for queue in queues:
        check_queue(queue)


def encode(record: Record) -> bytes:
    """A record as stored in KV: compact JSON without a job's usual nulls; decode() gives back exactly the record."""
    if "_kind" not in record:
        record = {k: v for k, v in record.items() if v is not None or k not in NULLABLE}
    return codec.dumps(record)


def decode(data: bytes) -> Record:
    record: Record = codec.loads(data)
    if "_kind" not in record:
        for key in NULLABLE:
            record.setdefault(key, None)
    return record


def public(record: Record) -> Record:
    """The envelope a client sees: internal fields (`_…`) and nulls dropped, a checkpoint as a next attempt reads it."""
    shown = {k: v for k, v in record.items() if not k.startswith("_") and v is not None}
    if (held := record.get(CHECKPOINT)) is not None:
        shown["checkpoint"] = {"state": held["state"], "sequence": held["sequence"]}
    return shown


def new_record(body: Any, now: datetime) -> Record:
    """A validated job record from a push body, state `available` or `scheduled`.

    Raises OjsError: 400 for the envelope, 422 for the retry policy.
    """
    if not isinstance(body, dict):
        raise OjsError(400, "invalid_request", "the request body must be a JSON object")
    job_type = body.get("type")
    if not isinstance(job_type, str) or not job_type:
        raise invalid("type is required: a dotted lowercase name such as email.send")
    if not TYPE_PATTERN.fullmatch(job_type):
        raise invalid(f"type {job_type!r} must match {TYPE_PATTERN.pattern}")
    if "args" not in body:
        raise invalid("args is required: a JSON array (it may be empty)")
    args = body["args"]
    if not isinstance(args, list):
        raise invalid("args must be a JSON array")
    if len(codec.dumps(args)) > MAX_ARGS_BYTES:
        raise invalid(f"args larger than {MAX_ARGS_BYTES} bytes")
    job_id = body.get("id")
    if job_id is not None and not is_job_id(job_id):
        raise invalid("id must be a lowercase UUIDv7")
    meta = body.get("meta")
    if (why := tenants.problem(meta)) or meta is not None and not isinstance(meta, dict):
        raise invalid(why or "meta must be an object")
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise invalid("options must be an object")
    queue = check_queue(options.get("queue", DEFAULT_QUEUE), "options.queue")
    priority = options.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise invalid("options.priority must be an integer from -100 to 100")
    for name in ("timeout_ms", "visibility_timeout_ms"):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise invalid(f"options.{name} must be a positive integer")
    tags = options.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
        raise invalid("options.tags must be a list of strings")
    if (why := limits.problem(options.get("rate_limit"))) is not None:
        raise invalid(why)
    policy = RetryPolicy.from_options(options.get("retry"), options.get("max_attempts"))
    run_at = options.get("scheduled_at", options.get("delay_until"))
    run_time = resolve_time(run_at, now, "scheduled_at") if run_at is not None else None
    expires = options.get("expires_at")
    expires_text = None
    if expires is not None:
        moment = resolve_time(expires, now, "expires_at")
        expires_text = expires if not expires.startswith("+") else iso(moment)  # echoed exactly as sent
    unique = options.get("unique")
    if unique is not None:
        validate_unique(unique)
    scheduled = run_time is not None and run_time > now
    if internal := sorted(k for k in body if k.startswith("_")):
        raise invalid(f"{internal[0]}: fields starting with _ are the server's own")
    record = {k: v for k, v in body.items() if k not in SYSTEM_FIELDS and k not in ("options",)}
    record.update({
        "id": job_id or uuid7(),
        "type": job_type,
        "queue": queue,
        "args": args,
        "priority": priority,
        "state": State.SCHEDULED if scheduled else State.AVAILABLE,
        "attempt": 0,
        "max_attempts": policy.max_attempts,
        "created_at": iso(now),
        "enqueued_at": None if scheduled else iso(now),
        "scheduled_at": iso(run_time) if run_time is not None else None,
        "expires_at": expires_text,
        "timeout_ms": options.get("timeout_ms"),
        "tags": tags,
        "retry": options.get("retry"),
        "unique": unique,
        "options": options or None,
    })
    return record


def new_records(body: Any, now: datetime) -> list[Record]:
    """A bulk enqueue (`{"jobs": [...]}`): every item valid, or an error naming the first wrong one."""
    jobs = body.get("jobs") if isinstance(body, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise invalid("jobs must be a non-empty list of jobs")
    if len(jobs) > MAX_BATCH:
        raise invalid(f"a batch holds at most {MAX_BATCH} jobs, got {len(jobs)}")
    records = []
    for index, item in enumerate(jobs):
        try:
            records.append(new_record(item, now))
        except OjsError as exc:
            raise OjsError(exc.status, exc.code, f"jobs[{index}]: {exc.message}") from None
    if len({r["id"] for r in records}) < len(records):
        raise invalid("two jobs of the batch have the same id")
    queues = len({r["queue"] for r in records})
    if len(records) + queues > MAX_BATCH:
        raise invalid(f"a batch is stored at once with each queue's count: its jobs and queues number at most "
                      f"{MAX_BATCH}, got {len(records)} jobs in {queues} queue(s)")
    return records


def validate_unique(unique: Any) -> None:
    if not isinstance(unique, dict):
        raise invalid("options.unique must be an object")
    if "keys" in unique and "key" in unique and unique["keys"] != unique["key"]:
        raise invalid("options.unique.keys and options.unique.key (the Python SDK's name) differ: send one")
    keys = unique_keys(unique)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise invalid("options.unique.keys must be a list of field names")
    if unique.get("on_conflict", "reject") not in ("reject", "ignore", "replace"):
        raise invalid("options.unique.on_conflict must be reject, ignore or replace")
    states = unique.get("states")
    if states is not None and (not isinstance(states, list) or not set(states) <= set(STATES)):
        raise invalid("options.unique.states must list job states")
    if unique.get("period") is not None:
        parse_duration(unique["period"], "options.unique.period")


def unique_keys(unique: dict[str, Any]) -> Any:
    return unique.get("keys", unique.get("key", ["type", "args"]))


def visibility_ms(record: Record, requested: Any = None) -> int:
    if isinstance(requested, int) and not isinstance(requested, bool) and requested > 0:
        return requested
    options = record.get("options") or {}
    own = options.get("visibility_timeout_ms")
    return own if isinstance(own, int) and own > 0 else DEFAULT_VISIBILITY_MS
