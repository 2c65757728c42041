"""A native worker's acks, stored together: River's completer for the jobs this process handed out.

`Operations.ack` is one coroutine chain and one commit per job, each waiting for its batch
(seamq.jobs.tallied). Acks said together here are moved, written and let go in one pass: their
commits join the store's batches with no task or wait of their own. Only the common case goes this
way, a job this process handed out and still holds as active, outside a workflow; any other ack,
and one whose compare-and-set lost (a heartbeat, a timer or another server wrote meanwhile), goes
as `Operations.ack` goes, which reads the job again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from seamq.jobs import job as moves
from seamq.jobs.job import Aftermath, Job, State, aftermath, counted, to_record
from seamq.jobs.operations import Operations
from seamq.jobs.ports import Conflict, Write


async def acks(ops: Operations, said: list[tuple[str, Any]], *, may_wait: float = 0.0) -> list[dict | BaseException]:
    """Each ack's outcome, in order: the job's record as stored once completed, or the error `ack` raises."""
    now, alone, done = ops.clock(), [], [None] * len(said)
    together: list[tuple[int, Job, Job, int, Aftermath, dict]] = []
    for n, (job_id, result) in enumerate(said):
        job, revision = ops.handed_out.get(job_id) or (None, 0)
        if job is None or job.state != State.ACTIVE or job.workflow_id is not None:
            alone.append(n)
            continue
        moved = moves.completed(job, now, result)
        await ops.admission.ready(moved)
        together.append((n, job, moved, revision, aftermath(job, moved), to_record(moved)))
    outcomes = await ops.store.commit_each(
        [[Write(job.id, record, revision, True, counted(job), may_wait)] for _, job, _, revision, _, record in together])
    for (n, job, moved, _, after, record), outcome in zip(together, outcomes):
        if isinstance(outcome, Conflict):  # written meanwhile (a heartbeat, a timer, another server): read again
            alone.append(n)
        elif isinstance(outcome, BaseException):
            done[n] = outcome
        else:
            await ops.after_stored(moved, outcome[0], job, after, record)
            done[n] = record
    answers = await asyncio.gather(*(ops.ack(*said[n], may_wait=may_wait) for n in alone), return_exceptions=True)
    for n, answer in zip(alone, answers):
        done[n] = answer
    return done  # type: ignore[return-value]  # every place filled
