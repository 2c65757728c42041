"""PgQueuer 1.6 for bench/peers_jobs.py: `durable` tables (its default: every table logged), jobs
enqueued through `Queries.enqueue` on an asyncpg pool, run by `PgQueuer` (LISTEN/NOTIFY)."""

import asyncio
import json
import os
from datetime import timedelta

import asyncpg

from bench.peers.jobs_driver import main
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, PgQueuer, Queries


class PgQueuerPeer:
    durability = "PostgreSQL, all tables logged (`durable`, its default); fsync and synchronous_commit on"

    async def setup(self, done) -> None:
        dsn = os.environ["PEER_DSN"]
        self.pool = await asyncpg.create_pool(dsn, min_size=4, max_size=20)
        self.queries = Queries(AsyncpgPoolDriver(self.pool))
        await self.queries.install()
        self.conn = await asyncpg.connect(dsn)
        self.qm = PgQueuer(AsyncpgDriver(self.conn))

        @self.qm.entrypoint("noop")
        async def noop(job) -> None:
            done(json.loads(job.payload))

    async def enqueue(self, args: dict) -> None:
        await self.queries.enqueue("noop", json.dumps(args).encode())

    async def enqueue_batch(self, batch: list[dict]) -> None:
        await self.queries.enqueue(["noop"] * len(batch), [json.dumps(a).encode() for a in batch], [0] * len(batch))

    async def enqueue_in(self, args: dict, seconds: float) -> None:
        await self.queries.enqueue("noop", json.dumps(args).encode(), execute_after=timedelta(seconds=seconds))

    async def work(self, concurrency: int) -> None:
        self.task = asyncio.create_task(self.qm.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency,
                                                    dequeue_timeout=timedelta(seconds=1)))

    async def close(self) -> None:
        self.qm.shutdown.set()
        await asyncio.wait_for(asyncio.gather(self.task, return_exceptions=True), 30)
        await self.conn.close()
        await self.pool.close()


if __name__ == "__main__":
    main(PgQueuerPeer())
