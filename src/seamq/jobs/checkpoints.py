"""Checkpoints (`urn:ojs:ext:durable-execution`): what a long job saves as it goes, given back to its
next attempt, so that a job killed halfway resumes instead of starting again (no I/O here).

A job has at most one checkpoint, kept in its own record (`model.CHECKPOINT`), so a save is a change
of the job by the same compare-and-set as every other: it meets the job as last stored, none lands
once the job has ended, and the next attempt's fetch reads it with the job at no extra cost. The
OJS spec asks that a checkpoint be deleted when its job ends; its conformance suite reads it after
the job completed (EXT-DUR-020), so it is kept, read-only, for as long as the job's record is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from seamq import codec
from seamq.jobs.job import Job, State, replace
from seamq.jobs.model import CHECKPOINT, FINISHED, OjsError, conflict, invalid, iso

# The spec caps a checkpoint at 1 MB, but NATS stores a record in one message (1 MiB by default),
# beside the job's args (up to 512 KiB): a quarter of a MiB keeps every record storable.
MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Given:
    """A save as the request asked for it: the suite's `{state}`, or the SDKs' `{state, step_index,
    metadata}`; `worker_id`, when sent, must be the worker that holds the job."""
    state: Any
    step_index: int | None = None
    metadata: dict | None = None
    worker_id: str | None = None


def given(body: Any) -> Given:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object: {\"state\": ...}")
    if "state" not in body:
        raise invalid("state is required: any JSON value, what the job's next attempt resumes from")
    step, metadata, worker = body.get("step_index"), body.get("metadata"), body.get("worker_id")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise invalid("step_index must be a non-negative integer")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata must be an object")
    if worker is not None and not isinstance(worker, str):
        raise invalid("worker_id must be a string")
    size = len(codec.dumps([body["state"], metadata]))
    if size > MAX_BYTES:
        raise OjsError(413, "invalid_payload", f"a checkpoint holds at most {MAX_BYTES} bytes, this one {size}: "
                                               "keep large state elsewhere and save a reference to it")
    return Given(body["state"], step, metadata, worker)


def saved(job: Job, save: Given, now: datetime) -> Job:
    """The job with `save` as its checkpoint, numbered one after the last (1 after a delete)."""
    if job.state in FINISHED:
        raise conflict(f"job {job.id} is {job.state.value}: a checkpoint is saved only before its job ends")
    if save.worker_id and job.state == State.ACTIVE and job.worker_id and job.worker_id != save.worker_id:
        raise conflict(f"job {job.id} is held by worker {job.worker_id}, not {save.worker_id}")
    last = job.extra.get(CHECKPOINT)
    held = {"state": save.state, "sequence": (last["sequence"] if last else 0) + 1, "created_at": iso(now),
            "step_index": save.step_index, "metadata": save.metadata}
    return replace(job, extra={**job.extra, CHECKPOINT: {k: v for k, v in held.items() if v is not None}})


def cleared(job: Job) -> Job:
    return replace(job, extra={k: v for k, v in job.extra.items() if k != CHECKPOINT})


def shown(job_id: str, held: dict, *, with_state: bool = True) -> dict:
    """A checkpoint as the API answers it: its fields at the top (as the suite reads them) and under
    `checkpoint` (as the spec and the SDKs do)."""
    fields = {"job_id": job_id, **{k: v for k, v in held.items() if with_state or k != "state"}}
    return {**fields, "checkpoint": dict(fields)}


def resume(job_id: str, held: dict | None) -> dict:
    """The SDKs' `GET /checkpoints/{id}/resume`: whether there is one to resume from, and it."""
    return {"job_id": job_id, "has_checkpoint": held is not None,
            **({"checkpoint": {"job_id": job_id, **held}} if held is not None else {})}
