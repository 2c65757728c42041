"""Probe: `seamq jobs serve` processing N waiting jobs over HTTP, the bench's 16 workers (fetch 10,
ack one by one); jobs/s and CPU per job of the server, nats-server and the bench client, and with
`--profile F` a py-spy profile of the server (F ending .txt: raw collapsed stacks).

    PYTHONPATH=. .venv/bin/python bench/probes/jobs_http.py 20000 [--profile out.svg]
"""
import asyncio, os, resource, subprocess, sys, time
from bench.common import CpuWindow, services
from bench.jobs import Http, enqueue_batched, process

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
PROFILE = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None


async def main():
    from tests.jobs_harness import JobServer
    with services() as svc:
        server = JobServer(svc.nats.url, svc.root / "jobs.log").start()
        http = Http(server.url)
        try:
            await enqueue_batched(http, N, "probe")
            spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid",
                                    str(server.proc.pid), "-o", PROFILE, "--rate", "500",
                                    *(["-f", "raw"] if PROFILE.endswith(".txt") else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if PROFILE else None
            cpu = CpuWindow(server=(server.proc.pid,), nats=(svc.nats.proc.pid,))
            cpu.start()
            own = resource.getrusage(resource.RUSAGE_SELF)
            started = time.perf_counter()
            rate = await process(http, N, "probe")
            used = cpu.end()
            mine = resource.getrusage(resource.RUSAGE_SELF)
            used["client"] = mine.ru_utime + mine.ru_stime - own.ru_utime - own.ru_stime
            if spy:
                spy.send_signal(2)
                spy.wait(30)
            print(f"{rate:.0f} jobs/s in {time.perf_counter() - started:.1f} s;",
                  ", ".join(f"{k} {v / N * 1e6:.0f} us/job" for k, v in used.items()))
        finally:
            await http.close()
            server.stop()


asyncio.run(main())
