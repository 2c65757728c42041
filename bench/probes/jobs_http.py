"""Probe: `seamq jobs serve` processing N waiting jobs over HTTP, the bench's 16 workers (fetch 10,
ack one by one); jobs/s and CPU per job of the server, nats-server and the bench client.

    PYTHONPATH=. .venv/bin/python bench/probes/jobs_http.py 20000 [--profile out.svg]
"""
import asyncio, resource, sys, time
from bench.common import CpuWindow, services
from bench.jobs import Http, enqueue_batched, process
from bench.probes import profiled

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


async def main():
    from seamq.embedded import JobServer
    with services() as svc:
        server = JobServer(svc.nats.url, svc.root / "jobs.log").start()
        http = Http(server.url)
        try:
            await enqueue_batched(http, N, "probe")
            cpu = CpuWindow(server=(server.proc.pid,), nats=(svc.nats.proc.pid,))
            with profiled(server.proc.pid, rate=500):
                cpu.start()
                own = resource.getrusage(resource.RUSAGE_SELF)
                started = time.perf_counter()
                rate = await process(http, N, "probe")
                used = cpu.end()
                mine = resource.getrusage(resource.RUSAGE_SELF)
            used["client"] = mine.ru_utime + mine.ru_stime - own.ru_utime - own.ru_stime
            print(f"{rate:.0f} jobs/s in {time.perf_counter() - started:.1f} s;",
                  ", ".join(f"{k} {v / N * 1e6:.0f} us/job" for k, v in used.items()))
        finally:
            await http.close()
            server.stop()


asyncio.run(main())
