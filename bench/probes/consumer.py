"""Probe: `seamq consume` with the bench's in-process no-op handler and the inbox on, N messages
waiting; msgs/s and CPU per message of the consumer, PostgreSQL and nats-server, and with
`--profile F` a py-spy profile of the consumer (F ending .txt: raw collapsed stacks).

    PYTHONPATH=. .venv/bin/python bench/probes/consumer.py 50000 [--profile out.svg]
"""
import asyncio, os, subprocess, sys
import psycopg
from bench.common import CpuWindow, bench_topology, cpu_per_row, fresh_database, provision, publish_events, services, spawn, stop
from seamq.topology import load_topology

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
PROFILE = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None


async def main():
    with services() as svc:
        topology_file = bench_topology(svc.root)
        await provision(svc.nats.url, load_topology(topology_file))
        await publish_events(svc.nats.url, N, 256)
        dsn = await fresh_database(svc, "probe")
        env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                      SEAMQ_CONSUMER__BATCH_SIZE=500, PYTHONPATH=os.getcwd())
        consumer = spawn([sys.executable, "-m", "seamq", "consume", "--consumer", "sea__from_vibespro"], env)
        spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid",
                                str(consumer.pid), "-o", PROFILE, "--rate", "1000",
                                *(["-f", "raw"] if PROFILE.endswith(".txt") else [])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if PROFILE else None
        cpu = CpuWindow(consumer=(consumer.pid,), pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,))
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = lambda: conn.execute("SELECT count(*) FROM inbox_messages").fetchone()[0]  # noqa: E731
            used = await cpu_per_row(cpu, rows, N, timeout=600)
            n, seconds = conn.execute("SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) "
                                      "FROM inbox_messages").fetchone()
        if spy:
            spy.send_signal(2)
            spy.wait(30)
        stop(consumer)
        print(f"{n / float(seconds):.0f} msgs/s", used)


asyncio.run(main())
