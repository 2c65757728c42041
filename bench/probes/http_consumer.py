"""Probe: `seamq consume` in HTTP handler mode against the bench's uvicorn handler, N messages
waiting; CPU per message of the consumer, uvicorn, PostgreSQL and nats-server (LANES: the
consumer's concurrency, 32 by default).

    PYTHONPATH=. .venv/bin/python bench/probes/http_consumer.py 20000 [--profile out.svg]
"""
import asyncio, os, sys
from bench.common import (CpuWindow, bench_topology, fresh_database, provision, publish_events, serve_http_app,
                          services, spawn, stop)
from bench.probes import inbox_rate, profiled
from seamq.embedded import free_port
from seamq.topology import load_topology

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


async def main():
    port = free_port()
    server = serve_http_app(port)
    try:
        with services() as svc:
            topology_file = bench_topology(svc.root)
            await provision(svc.nats.url, load_topology(topology_file))
            await publish_events(svc.nats.url, N, 256)
            dsn = await fresh_database(svc, "http")
            env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__HANDLER_URL=f"http://127.0.0.1:{port}/handle",
                          SEAMQ_CONSUMER__CONCURRENCY=int(os.environ.get("LANES", "32")), SEAMQ_CONSUMER__BATCH_SIZE=500,
                          PYTHONPATH=os.getcwd())
            consumer = spawn([sys.executable, "-m", "seamq", "consume", "--consumer", "sea__from_vibespro"], env)
            with profiled(consumer.pid):
                rate, used = await inbox_rate(dsn, CpuWindow(consumer=(consumer.pid,), uvicorn=(server.pid,),
                                                             pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,)), N)
            stop(consumer)
            print(f"{rate:.0f} msgs/s", used)
    finally:
        server.terminate()
        server.wait(10)


asyncio.run(main())
