"""procrastinate 3 for bench/peers_jobs.py: `defer_async` and `batch_defer_async` through a psycopg
pool, a worker with 16 concurrent tasks polling every 0.05 s besides its LISTEN/NOTIFY."""

import asyncio
import os

import procrastinate

from bench.peers.jobs_driver import main


class ProcrastinatePeer:
    durability = "PostgreSQL, every table logged; fsync and synchronous_commit on"

    async def setup(self, done) -> None:
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=os.environ["PEER_DSN"], min_size=4, max_size=20))

        @self.app.task(name="noop", queue="bench")
        async def noop(**args) -> None:
            done(args)

        self.noop = noop
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, args: dict) -> None:
        await self.noop.defer_async(**args)

    async def enqueue_batch(self, batch: list[dict]) -> None:
        await self.noop.batch_defer_async(*batch)

    async def enqueue_in(self, args: dict, seconds: float) -> None:
        await self.noop.configure(schedule_in={"seconds": seconds}).defer_async(**args)

    async def work(self, concurrency: int) -> None:
        self.task = asyncio.create_task(self.app.run_worker_async(
            queues=["bench"], concurrency=concurrency, wait=True, install_signal_handlers=False,
            fetch_job_polling_interval=0.05))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.app.close_async()


if __name__ == "__main__":
    main(ProcrastinatePeer())
