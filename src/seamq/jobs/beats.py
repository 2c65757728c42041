"""`/workers/beat` (seamq's graceful shutdown; the SDKs' workers send it too): a worker says its state
(running, quiet, drain, terminate) and how many jobs it runs. No job changes with it: the server's
registry of workers hears it (seamq.jobs.activity), and a state other than the one last said is kept
for every server to follow (seamq.jobs.queues), so that none hands a quiet or draining worker a job.
Its leases are extended by `Operations.heartbeat`, which names them.
"""

from __future__ import annotations

from typing import Any

from seamq.jobs import model
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
