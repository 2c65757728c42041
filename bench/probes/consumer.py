"""Probe: `seamq consume` with the bench's in-process no-op handler and the inbox on, N messages
waiting; msgs/s and CPU per message of the consumer, PostgreSQL and nats-server.

    PYTHONPATH=. .venv/bin/python bench/probes/consumer.py 150000 [--profile out.svg]
"""
import asyncio, os, sys
from bench.common import CpuWindow, bench_topology, fresh_database, provision, publish_events, services, spawn, stop
from bench.probes import inbox_rate, profiled
from seamq.topology import load_topology

N = int(sys.argv[1]) if len(sys.argv) > 1 else 150000


async def main():
    with services() as svc:
        topology_file = bench_topology(svc.root)
        await provision(svc.nats.url, load_topology(topology_file))
        await publish_events(svc.nats.url, N, 256)
        dsn = await fresh_database(svc, "probe")
        env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                      SEAMQ_CONSUMER__BATCH_SIZE=500, PYTHONPATH=os.getcwd())
        consumer = spawn([sys.executable, "-m", "seamq", "consume", "--consumer", "sea__from_vibespro"], env)
        with profiled(consumer.pid):
            rate, used = await inbox_rate(dsn, CpuWindow(consumer=(consumer.pid,), pg=(svc.pg.proc.pid,),
                                                         nats=(svc.nats.proc.pid,)), N)
        stop(consumer)
        print(f"{rate:.0f} msgs/s", used)


asyncio.run(main())
