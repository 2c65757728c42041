"""Probe: `seamq consume` in HTTP handler mode against the bench's uvicorn handler, N messages
waiting; CPU per message of the consumer, uvicorn, PostgreSQL and nats-server, and with `--profile F`
a py-spy flame graph (SVG) of the consumer.

    PYTHONPATH=. .venv/bin/python bench/probes/http_consumer.py 20000 [--profile out.svg]
"""
import asyncio, os, subprocess, sys
import psycopg
from bench.common import (CpuWindow, bench_topology, cpu_per_row, fresh_database, provision, publish_events,
                          serve_http_app, services, spawn, stop)
from seamq.embedded import free_port
from seamq.topology import load_topology

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
PROFILE = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None


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
                          SEAMQ_CONSUMER__CONCURRENCY=int(os.environ.get("LANES", "32")), SEAMQ_CONSUMER__BATCH_SIZE=500, PYTHONPATH=os.getcwd())
            consumer = spawn([sys.executable, "-m", "seamq", "consume", "--consumer", "sea__from_vibespro"], env)
            spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid",
                                    str(consumer.pid), "-o", PROFILE, "--rate", "1000", *(["-f", "raw"] if PROFILE.endswith(".txt") else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if PROFILE else None
            cpu = CpuWindow(consumer=(consumer.pid,), uvicorn=(server.pid,), pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,))
            with psycopg.connect(dsn, autocommit=True) as conn:
                done = lambda: conn.execute("SELECT count(*) FROM inbox_messages WHERE status = 'processed'").fetchone()[0]
                used = await cpu_per_row(cpu, done, N, timeout=600)
                n, seconds = conn.execute("SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) "
                                          "FROM inbox_messages").fetchone()
            if spy:
                spy.send_signal(2)
                spy.wait(30)
            stop(consumer)
            print(f"{n / float(seconds):.0f} msgs/s", used)
    finally:
        server.terminate()
        server.wait(10)


asyncio.run(main())
