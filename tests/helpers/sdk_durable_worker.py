"""The official Python SDK's worker (../shared/ojs-sdks, unmodified) running a durable job through its
`ojs.durable.DurableContext`, for tests/integration/jobs/test_jobs_checkpoints.py:

    python tests/helpers/sdk_durable_worker.py URL EFFECTS

The job takes six steps, each a side effect the SDK records in its checkpoint's replay log, noted in
EFFECTS as it runs. Its first attempt waits after step 3 is stored (for a kill -9); a later one is
expected to replay steps 1-3 from the checkpoint without running them again.
"""

from __future__ import annotations

import asyncio
import os
import sys

import ojs
from ojs.durable import DurableContext

URL, EFFECTS = sys.argv[1], sys.argv[2]


def note(line: str) -> None:
    with open(EFFECTS, "a") as effects:
        effects.write(line + "\n")


async def main() -> None:
    worker = ojs.Worker(URL, queues=["sdk-durable"], concurrency=1, poll_interval=0.1, heartbeat_interval=0.5,
                        visibility_timeout_ms=2000)

    @worker.register("test.durable-steps")
    async def steps(ctx: ojs.JobContext) -> dict:
        dc = await DurableContext.create(ctx)
        for step in range(1, 7):
            async def effect(step: int = step) -> int:
                note(f"effect {step} {os.getpid()}")
                return step
            await dc.side_effect(f"step-{step}", effect)
            await dc.checkpoint(step, {"step": step})
            if step == 3 and ctx.job.attempt == 1:
                note("saved 3")
                await asyncio.sleep(3600)
        await dc.complete()
        return {"steps": 6, "attempt": ctx.job.attempt}

    await worker.start()


asyncio.run(main())
