"""What a job function is handed to save its progress and resume from it (durable execution):

    @jobs.handler("data.migrate")
    async def migrate(source, *, checkpoint):
        done = checkpoint.state or 0           # what the last attempt saved, or None on the first
        for batch in batches(source, after=done):
            copy(batch)
            done = batch.last_id
            await checkpoint.save(done)        # stored with the job before this returns

A function asks for it by naming a `checkpoint` parameter; the worker hands it over for each attempt,
filled from the job's envelope, which the server gives a checkpoint once one was saved
(seamq.jobs.checkpoints). A sync function, run in a thread, saves with `save_blocking`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Saving(Protocol):
    """The calls a checkpoint makes of the worker's client (seamq.jobs.client or seamq.jobs.native)."""

    async def save_checkpoint(self, job_id: str, state: Any, *, worker_id: str | None = None) -> dict: ...

    async def delete_checkpoint(self, job_id: str) -> dict: ...


class Checkpoint:
    def __init__(self, client: Saving, job: dict, worker_id: str) -> None:
        held = job.get("checkpoint") or {}
        self.resumed = "checkpoint" in job  # a previous attempt saved one
        self.state: Any = held.get("state")
        self.sequence: int = held.get("sequence", 0)
        self._client, self._job_id, self._worker_id = client, job["id"], worker_id
        self._loop = asyncio.get_running_loop()

    async def save(self, state: Any) -> None:
        """Store `state` (any JSON value) as what the job's next attempt resumes from, replacing the last."""
        answer = await self._client.save_checkpoint(self._job_id, state, worker_id=self._worker_id)
        self.state, self.sequence = state, answer["sequence"]

    async def clear(self) -> None:
        """Drop the checkpoint: a next attempt starts from the beginning."""
        await self._client.delete_checkpoint(self._job_id)
        self.state, self.sequence = None, 0

    def save_blocking(self, state: Any) -> None:
        """`save` from a sync function's thread: returns once stored."""
        asyncio.run_coroutine_threadsafe(self.save(state), self._loop).result()
