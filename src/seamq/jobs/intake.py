"""The job server's side of transactional enqueue: jobs written to the outbox in the caller's
database transaction (seamq.jobs.enqueue), published by the relay to `OJS_ENQUEUE`, are created here.

The job id is the key end to end: the outbox row's id, the message's
`Nats-Msg-Id` (JetStream drops a copy a relay re-publishes after dying before
it marked the row), and the job's KV key (created only if absent), so a commit
makes exactly one job however often its message comes. A job the server
refuses (its args do not match the registered schema) is kept as a discarded
job with the refusal as its error, visible like any other; a message that is
no job at all is logged and dropped. Anything transient (NATS away) leaves the
message to come again.
"""

from __future__ import annotations

import asyncio
import json

from seamq.jobs import model
from seamq.jobs.model import OjsError, State, iso, utcnow
from seamq.observability import log
from seamq.model import describe

RETRY_AFTER = 1.0  # seconds before a message that met a transient failure comes again


def refused(body: dict, error: OjsError) -> dict:
    """The job as enqueued, discarded with the server's refusal as its one error."""
    now = utcnow()
    record = model.new_record(body, now)
    entry = {"code": error.code, "type": "JobRefused", "message": error.message, "retryable": False,
             "attempt": 0, "occurred_at": iso(now)}
    return {**record, "state": State.DISCARDED, "discarded_at": iso(now), "error": entry, "errors": [entry]}


async def run(engine) -> None:
    """Take in relayed jobs until cancelled."""
    store = engine.store
    while True:
        try:
            taken = await store.taken_in()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS away: the messages wait in the stream
            log.warning("jobs_intake_failed", error=describe(exc))
            await asyncio.sleep(RETRY_AFTER)
            continue
        for data, handle in taken:
            try:
                outcome = await take_in(engine, data)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("jobs_intake_retry", error=describe(exc))
                await store.later(handle, RETRY_AFTER)
                continue
            if outcome == "not a job":
                log.error("jobs_intake_not_a_job", size=len(data), head=data[:200].decode(errors="replace"))
            await store.intake_done(handle)


async def take_in(engine, data: bytes) -> str:
    """`created`, `duplicate` (already taken in), `refused` (kept discarded) or `not a job`."""
    try:
        body = json.loads(data)
    except ValueError:
        return "not a job"
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        return "not a job"
    if await engine.ops.exists(body["id"]):
        return "duplicate"
    try:
        await engine.ops.push(body)
        return "created"
    except OjsError as exc:
        if exc.code == "duplicate":
            return "duplicate"
        if exc.status >= 500 or exc.status in (409, 429):
            raise  # transient (a racing writer, a queue at its bound): again later, never discarded
        try:
            record = refused(body, exc)
        except OjsError:
            return "not a job"
        await engine.ops.admission.refused(record)
        log.warning("jobs_intake_refused", job_id=body["id"], code=exc.code, error=exc.message)
        return "refused"
