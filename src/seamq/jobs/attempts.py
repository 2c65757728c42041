"""What a worker reports: a failed attempt (the `errors[]` entry it becomes, and the error's type that
`non_retryable_errors` match), the jobs a heartbeat names, read from whichever shape the client
sent, and how long its ack may wait. No I/O."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from seamq.jobs.model import MAX_BATCH, State, invalid, iso, public

# seamq's worker does not wait on its acks and nacks: it says so, and a seamq server may hold one this
# long to store it in one batch with others (seamq.jobs.tallied). Not OJS: other clients never wait.
MAY_WAIT_HEADER, MAY_WAIT_MOST_MS = "X-Seamq-May-Wait", 50


def may_wait(said: str | None) -> float:
    """Seconds from the header's value (whole milliseconds); 0 when not said."""
    if said is None:
        return 0.0
    if not (said.isascii() and said.isdigit()) or int(said) > MAY_WAIT_MOST_MS:
        raise invalid(f"{MAY_WAIT_HEADER} must be whole milliseconds from 0 to {MAY_WAIT_MOST_MS}, got {said[:40]!r}")
    return int(said) / 1000


RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")  # `ValueError: bad`, `mod.Error`, JS `TypeError: x`


def error_type(error: dict[str, Any]) -> str:
    """`errors[].type`: the client's, else `details.error_class`, else the class the SDKs' workers
    name only in the trace they send (Python: its last line; JS: the stack's first), else from the
    message (L1-RTR-014)."""
    details = error.get("details")
    if not isinstance(details, dict):
        details = {}
    for candidate in (error.get("type"), details.get("error_class")):
        if isinstance(candidate, str) and candidate:
            return candidate
    for trace, line in ((details.get("traceback"), -1), (details.get("stack"), 0)):
        lines = [t for t in trace.strip().splitlines() if t.strip()] if isinstance(trace, str) else []
        found = RAISED.match(lines[line].strip()) if lines else None
        if found:
            return found.group(1)
    message = str(error.get("message", "")).lower()
    if re.search(r"time[ds]? ?out|timed out", message):
        return "ConnectionTimeout"
    if "rate limit" in message:
        return "RateLimitExceeded"
    code = str(error.get("code", ""))
    if code and code not in ("handler_error", "error"):
        return code
    return "InternalServerError"


def error_entry(error: Any, attempt: int, now: datetime) -> dict[str, Any]:
    """One `errors[]` entry (and the job's `error`) from a nack's error object."""
    if not isinstance(error, dict):
        error = {"message": str(error) if error is not None else "failed"}
    entry = {
        "code": str(error.get("code") or "handler_error"),
        "type": error_type(error),
        "message": str(error.get("message") or "failed"),
        "retryable": error.get("retryable", True) is not False,
        "attempt": attempt,
        "occurred_at": iso(now),
    }
    if isinstance(error.get("details"), dict):
        entry["details"] = error["details"]
    if isinstance(error.get("rate_limit_until"), str):  # the job's rate limit key waits until then (seamq.jobs.limiter)
        entry["rate_limit_until"] = error["rate_limit_until"][:64]
    return entry


def heartbeat_ids(active_jobs: Any, active_job_ids: Any) -> list[str]:
    """The job ids a heartbeat names: `active_jobs` as a list (the spec, the Python SDK), or
    `active_job_ids` with `active_jobs` as their count (the JS SDK). A count without the ids
    would extend nothing, so it is refused rather than answered as if it had."""
    ids = active_job_ids if active_job_ids is not None else active_jobs
    if ids is None or (isinstance(ids, int) and not isinstance(ids, bool) and ids == 0):
        return []
    if isinstance(ids, int) and not isinstance(ids, bool):
        raise invalid(f"active_jobs is a count ({ids}): name the jobs in active_job_ids (or send active_jobs "
                      "as their list) so that their leases can be extended")
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise invalid("active_jobs (or active_job_ids) must be a list of job ids")
    if active_job_ids is not None and isinstance(active_jobs, int) and not isinstance(active_jobs, bool) \
            and active_jobs != len(ids):
        raise invalid(f"active_jobs says {active_jobs} jobs but active_job_ids names {len(ids)}")
    if len(ids) > MAX_BATCH:
        raise invalid(f"a heartbeat names at most {MAX_BATCH} jobs")
    return list(dict.fromkeys(ids))


def ack_answer(record: dict[str, Any]) -> dict[str, Any]:
    """An ack's answer: the job as stored after it."""
    return {"acknowledged": True, "id": record["id"], "job_id": record["id"], "state": record["state"],
            "completed_at": record["completed_at"], "job": public(record)}


def nack_answer(record: dict[str, Any]) -> dict[str, Any]:
    """A nack's answer: the job as stored after it, and when it runs again or why it will not."""
    answer = {"id": record["id"], "job_id": record["id"], "state": record["state"], "attempt": record["attempt"],
              "max_attempts": record["max_attempts"], "job": public(record)}
    keys = ("retry_delay_ms", "next_attempt_at") if record["state"] == State.RETRYABLE else ()
    for key in (*keys, "discarded_at", "completed_at"):
        if record.get(key) is not None:
            answer[key] = record[key]
    return answer
