"""arq 0.28 on Redis for bench/peers_jobs.py: `ArqRedis.enqueue_job`, a `Worker` with max_jobs 16 and
poll_delay 0.05 s (its default 0.5 s would add up to half a second to a scheduled job). No batch enqueue."""

import asyncio
import os
from urllib.parse import urlsplit

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker, func

from bench.peers.jobs_driver import main


class ArqPeer:
    durability = "Redis as Debian ships it: RDB snapshots, no append-only file (a crash loses recent jobs)"
    has_batch = False

    async def setup(self, done) -> None:
        url = urlsplit(os.environ["PEER_REDIS"])
        self.settings = RedisSettings(host=url.hostname, port=url.port)
        self.redis = await create_pool(self.settings)

        async def noop(ctx, args: dict) -> None:
            done(args)

        self.noop = noop

    async def enqueue(self, args: dict) -> None:
        await self.redis.enqueue_job("noop", args)

    async def enqueue_in(self, args: dict, seconds: float) -> None:
        await self.redis.enqueue_job("noop", args, _defer_by=seconds)

    async def work(self, concurrency: int) -> None:
        self.worker = Worker(functions=[func(self.noop, name="noop")], redis_settings=self.settings, max_jobs=concurrency,
                             poll_delay=0.05, handle_signals=False, keep_result=0)
        self.task = asyncio.create_task(self.worker.async_run())

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)  # (its close() re-raises the cancel)
        await self.redis.aclose()


if __name__ == "__main__":
    main(ArqPeer())
