"""Probe: the native worker (`seamq jobs worker --nats`, 16 at once, no-op jobs) and PgQueuer on the
same machine in the same run, twice, alternating; as bench/peers_jobs.py measures them.

    PYTHONPATH=.:src .venv/bin/python bench/probes/native_vs_pgqueuer.py [jobs]
"""
import asyncio, sys
from bench.common import services
from bench.jobs import processed_native
from bench.peers_jobs import peer_row

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000


async def main():
    with services() as svc:
        for _ in range(2):
            row = await peer_row(svc, "bench.peers.jobs_pgqueuer", "postgres", None, N)
            print(f"PgQueuer: {row['processed']:,} jobs/s", flush=True)
            print(f"native:   {round(await processed_native(svc.nats.url, 2 * N, 'native')):,} jobs/s", flush=True)


asyncio.run(main())
