"""Oban for Python (the `oban` package, 0.6) for bench/peers_jobs.py. It needs Python >= 3.12, so
`make bench` runs it from a venv of its own (.venv-oban). Jobs are enqueued with `enqueue` and
`enqueue_many` (one INSERT) and run by a queue with a limit of 16; scheduled jobs are made
available by its stager, every second by default."""

import os
from datetime import timedelta

from bench.peers.jobs_driver import main
from oban import Oban, worker
from oban.schema import install


class ObanPeer:
    durability = "PostgreSQL, every table logged; fsync and synchronous_commit on"

    async def setup(self, done) -> None:
        self.pool = await Oban.create_pool(os.environ["PEER_DSN"], min_size=4, max_size=20)
        await install(self.pool)
        self.client = await Oban(pool=self.pool, name="client").start()  # enqueues only

        @worker(queue="bench", oban="client")
        class Noop:
            async def process(self, job) -> None:
                done(job.args)

        self.noop = Noop

    async def enqueue(self, args: dict) -> None:
        await self.client.enqueue(self.noop.new(args))

    async def enqueue_batch(self, batch: list[dict]) -> None:
        await self.client.enqueue_many([self.noop.new(args) for args in batch])

    async def enqueue_in(self, args: dict, seconds: float) -> None:
        await self.client.enqueue(self.noop.new(args, schedule_in=timedelta(seconds=seconds)))

    async def work(self, concurrency: int) -> None:
        self.server = await Oban(pool=self.pool, name="server", queues={"bench": concurrency}).start()

    async def close(self) -> None:
        await self.server.stop()
        await self.client.stop()
        await self.pool.close()


if __name__ == "__main__":
    main(ObanPeer())
