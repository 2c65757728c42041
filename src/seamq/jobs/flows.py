"""Workflows over the store: created with their first jobs, moved on as their jobs end, cancelled.

The rules are seamq.jobs.workflows' (no I/O); this reads and writes the records.
A job's end and its workflow's next move (the record, the next step's job or
the callbacks) are one atomic batch, each with its compare-and-set: two jobs of
one group ending at once on two servers cannot both move the workflow from the
same revision; the one that loses reads the workflow again and tries again.
"""

from __future__ import annotations

from typing import Any

from seamq.jobs.job import from_record
from seamq.jobs import workflows
from seamq.jobs.admission import Admission
from seamq.jobs.model import OjsError, conflict, is_job_id
from seamq.jobs.ports import CAS_TRIES, Conflict, Stored, Write


class Flows:
    def __init__(self, admission: Admission) -> None:
        """`admission` creates and cancels a workflow's jobs (seamq.jobs.admission)."""
        self.admission, self.store = admission, admission.store

    async def create(self, body: Any) -> dict:
        workflow, first = workflows.new(body, self.admission.clock())
        await self.admission.create(first, also=[Write(workflows.key(workflow["id"]), workflow, 0)])
        await self.admission.events.emit("workflow.started", workflow)
        return await self._public(workflow)

    async def ending(self, record: dict) -> tuple[list[Write], list[dict], dict | None]:
        """What a job's end does to its workflow: the writes to commit with it, the jobs they create,
        and the workflow's new record."""
        held = await self.store.get(workflows.key(record["workflow_id"]))
        if held is None:
            return [], [], None
        moved, started = workflows.job_ended(held.record, record, self.admission.clock())
        if moved is None:
            return [], [], None
        for job in started:
            await self.admission.ready(from_record(job))
        writes = [Write(moved["_key"], moved, held.revision, finished=moved["state"] != workflows.RUNNING),
                  *(Write(job["id"], job) for job in started)]
        return writes, started, moved

    async def ended(self, moved: dict | None) -> None:
        if moved is not None and moved["state"] != workflows.RUNNING:
            await self.admission.events.emit(f"workflow.{moved['state']}", moved)

    async def get(self, workflow_id: str) -> dict:
        return await self._public((await self._load(workflow_id))[0])

    async def listing(self) -> list[dict]:
        found = [await self._public(r) for r, _ in await self.store.scan("wf.")]
        return sorted(found, key=lambda w: w["created_at"], reverse=True)

    async def _public(self, workflow: dict) -> dict:
        states = {}
        for job_id in workflows.job_ids_of(workflow):
            held = await self.store.get(job_id)
            if held is not None:
                states[job_id] = held.record["state"]
        return workflows.public(workflow, states)

    async def _load(self, workflow_id: str) -> Stored:
        held = await self.store.get(workflows.key(workflow_id)) \
            if is_job_id(workflow_id) else None
        if held is None:
            raise OjsError(404, "not_found", f"workflow {workflow_id} not found")
        return held

    async def cancel(self, workflow_id: str) -> dict:
        """The workflow and each of its jobs not yet ended, in one atomic batch; later steps never start."""
        for _ in range(CAS_TRIES):
            workflow, revision = await self._load(workflow_id)
            stopped = workflows.cancelled(workflow, self.admission.clock())
            jobs = []
            for job_id in workflows.job_ids_of(workflow):
                held = await self.store.get(job_id)
                if held is not None:
                    jobs.append(held)
            try:
                await self.admission.cancel_all(jobs, also=[Write(stopped["_key"], stopped, revision)])
                break
            except Conflict:
                continue  # a job of it moved meanwhile: read them all again
        else:
            raise conflict(f"workflow {workflow_id} kept changing while it was cancelled; try again")
        await self.admission.events.emit("workflow.cancelled", stopped)
        return await self._public(stopped)
