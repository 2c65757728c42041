"""What a running worker tells the server of itself: its beat and its heartbeat.

`/workers/beat` (seamq's graceful shutdown; the SDKs' workers send it too): a worker says its state
(running, quiet, drain, terminate) and how many jobs it runs. No job changes with it: the server's
registry of workers hears it (seamq.jobs.activity), and a state other than the one last said is kept
for every server to follow (seamq.jobs.queues), so that none hands a quiet or draining worker a job.
`/workers/heartbeat` names the jobs it runs, and extends their leases.
"""

from __future__ import annotations

from typing import Any

from seamq.jobs import attempts, model
from seamq.jobs import job as moves
from seamq.jobs.model import OjsError, State
from seamq.jobs.operations import Operations


async def beat(ops: Operations, worker_id: Any, said: Any, active_jobs: Any) -> dict:
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= 255:
        raise model.invalid("worker_id is required, 255 characters at most")
    count = len(active_jobs) if isinstance(active_jobs, list) else active_jobs if active_jobs is not None else 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise model.invalid("active_jobs must be a count or a list of job ids")
    now, said, shared = ops.clock(), said if said is not None else "running", ops.queues.said_by(worker_id)
    ops.workers.heard(worker_id, shared, now)
    asked = ops.workers.beat(worker_id, count, now, said)
    if said != (shared or {}).get("said", "running"):
        await ops.queues.say(worker_id, said, model.iso(now))
    return {"acknowledged": True, "worker_id": worker_id, "state": asked or said, "server_time": model.iso(now)}


async def heartbeat(ops: Operations, worker_id: Any, active_jobs: Any, visibility: Any = None,
                    active_job_ids: Any = None) -> dict:
    """Extend the leases of the jobs the worker names. `jobs_cancelled` names those cancelled
    meanwhile; `state: terminate` asks the worker to stop when every job it named was cancelled
    (the SDKs' workers know no other way to stop one job, and none of its other jobs is hurt)."""
    if not isinstance(worker_id, str) or not worker_id:
        raise model.invalid("worker_id is required")
    ids = attempts.heartbeat_ids(active_jobs, active_job_ids)
    now = ops.clock()
    directive = ops.workers.beat(worker_id, len(ids), now) or "running"  # asked through the admin API
    extended, cancelled = [], []
    for job_id in ids:
        try:
            before, longer, _ = await ops.change(job_id, lambda job: moves.extended(job, now, moves.lease(job, visibility)))
        except OjsError:  # not active (finished, cancelled, released), or no such job: not extended
            if await _cancelled(ops, job_id):
                cancelled.append(job_id)
            continue
        await ops.store.hold(longer.hold, (longer.lease_until - now).total_seconds())
        extended.append(job_id)
        hook = ((before.options or {}).get("metadata") or {}).get("test_directive")
        if ops.test_mode and hook in ("quiet", "terminate"):
            directive = hook
    if cancelled and len(cancelled) == len(ids):
        directive = "terminate"
    return {"state": directive, "jobs_extended": extended, "jobs_cancelled": cancelled, "server_time": model.iso(now)}


async def _cancelled(ops: Operations, job_id: Any) -> bool:
    try:
        return (await ops.load(job_id))[0].state == State.CANCELLED
    except OjsError:
        return False
