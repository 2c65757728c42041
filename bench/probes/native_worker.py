"""Probe: N waiting jobs processed by seamq's worker with a no-op function, over HTTP (one `seamq jobs
serve`) and native (the engine in the worker's process, seamq.jobs.native), at the given concurrency;
jobs/s and CPU per job.

    PYTHONPATH=.:src .venv/bin/python bench/probes/native_worker.py 10000 64 [--sync always]
"""
import asyncio, resource, sys, time
import nats
from bench.common import CpuWindow, services
from bench.jobs import Http, draining_worker, enqueue_batched
from seamq.jobs.client import JobsClient
from seamq.jobs.native import EngineClient, started_engine

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
CONCURRENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 64
SYNC = sys.argv[sys.argv.index("--sync") + 1] if "--sync" in sys.argv else "default"


async def drain(client, queue: str, pids: dict) -> str:
    worker = draining_worker(client, queue, N, CONCURRENCY)
    cpu = CpuWindow(**pids)
    cpu.start()
    own = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await worker.run()
    elapsed = time.perf_counter() - started
    used = cpu.end()
    mine = resource.getrusage(resource.RUSAGE_SELF)
    used["worker"] = mine.ru_utime + mine.ru_stime - own.ru_utime - own.ru_stime
    return f"{N / elapsed:,.0f} jobs/s; " + ", ".join(f"{k} {v / N * 1e6:.0f} us/job" for k, v in used.items())


async def main():
    from seamq.embedded import JobServer
    with services(nats_sync=SYNC) as svc:
        server = JobServer(svc.nats.url, svc.root / "jobs.log").start()
        http = Http(server.url)
        try:
            await enqueue_batched(http, N, "over-http")
            await enqueue_batched(http, N, "native")
            async with JobsClient(server.url) as client:
                print(f"HTTP,   {CONCURRENCY} at once, nats sync {SYNC}:",
                      await drain(client, "over-http", {"server": (server.proc.pid,), "nats": (svc.nats.proc.pid,)}))
            nc = await nats.connect(svc.nats.url)
            engine = await started_engine(nc)
            try:
                print(f"native, {CONCURRENCY} at once, nats sync {SYNC}:",
                      await drain(EngineClient(engine), "native", {"nats": (svc.nats.proc.pid,)}))
            finally:
                await engine.stop()
                await nc.close()
        finally:
            await http.close()
            server.stop()


asyncio.run(main())
