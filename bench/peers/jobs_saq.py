"""saq 0.26 on Redis for bench/peers_jobs.py: `Queue.enqueue`, a `Worker` with 16 jobs at once.
saq has no batch enqueue; `scheduled` takes whole epoch seconds."""

import asyncio
import math
import os

from bench.peers.jobs_driver import main
from saq import Queue, Worker


class SaqPeer:
    durability = "Redis as Debian ships it: RDB snapshots, no append-only file (a crash loses recent jobs)"
    has_batch = False

    async def setup(self, done) -> None:
        self.queue = Queue.from_url(os.environ["PEER_REDIS"])
        await self.queue.connect()

        async def noop(ctx, **args) -> None:
            done(args)

        self.noop = noop

    async def enqueue(self, args: dict) -> None:
        await self.queue.enqueue("noop", **args)

    async def enqueue_in(self, args: dict, seconds: float) -> None:
        await self.queue.enqueue("noop", scheduled=math.ceil(args["due"]), **args)

    async def work(self, concurrency: int) -> None:
        self.worker = Worker(self.queue, functions=[("noop", self.noop)], concurrency=concurrency)
        self.task = asyncio.create_task(self.worker.start())

    async def close(self) -> None:
        await self.worker.stop()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.queue.disconnect()


if __name__ == "__main__":
    main(SaqPeer())
