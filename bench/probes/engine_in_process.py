"""Probe: the job engine over the NATS store, in process, no HTTP; time spent per store call and CPU per job.

    PYTHONPATH=src python bench/probes/engine_in_process.py 5000    (LOOPS=64 for 64 fetch-and-ack loops; 16 by default)
"""
import asyncio, sys, tempfile, time
from pathlib import Path
import nats
from seamq.embedded import NatsServer
from seamq.jobs.engine import Engine
from seamq.jobs.nats_store import NatsJobStore
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
async def main():
    d = Path(tempfile.mkdtemp()); s = NatsServer(d / "nats"); s.start()
    try:
        nc = await nats.connect(s.url)
        store = await NatsJobStore(nc).start()
        import collections, functools
        spent = collections.Counter(); calls = collections.Counter()
        def timed(name, fn):
            @functools.wraps(fn)
            async def w(*a, **k):
                t0 = time.perf_counter()
                try: return await fn(*a, **k)
                finally: spent[name] += time.perf_counter() - t0; calls[name] += 1
            return w
        for name in ("get", "commit", "offer", "take", "settle", "arm", "hold", "finished"):
            setattr(store, name, timed(name, getattr(store, name)))
        engine = await Engine(store).start()
        t = time.perf_counter()
        for start in range(0, N, 200):
            await asyncio.gather(*(engine.ops.push({"type": "t", "args": [i], "options": {"queue": "q"}}) for i in range(start, min(N, start + 200))))
        enq = N / (time.perf_counter() - t)
        done = 0
        async def loop():
            nonlocal done
            while done < N:
                jobs = await engine.ops.fetch(["q"], 10, "w")
                if not jobs:
                    await asyncio.sleep(0.001); continue
                for j in jobs: await engine.ops.ack(j["id"])
                done += len(jobs)
        import os, psutil
        ns = psutil.Process(s.proc.pid); me = psutil.Process(os.getpid())
        c0 = (sum(ns.cpu_times()[:2]), sum(me.cpu_times()[:2]))
        t = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(int(os.environ.get("LOOPS", "16")))))
        rate = N / (time.perf_counter() - t)
        c1 = (sum(ns.cpu_times()[:2]), sum(me.cpu_times()[:2]))
        print(f"  CPU per processed job: nats-server {(c1[0]-c0[0])/N*1e6:.0f} us, engine {(c1[1]-c0[1])/N*1e6:.0f} us")
        for k, v in spent.most_common(): print(f"  {k}: {calls[k]} calls, {v:.2f} s total, {v/calls[k]*1000:.2f} ms each")
        print(f"engine over NATS, in process: enqueue {enq:,.0f}/s, processed {rate:,.0f}/s")
        await engine.stop(); await nc.close()
    finally:
        s.kill()
asyncio.run(main())
