"""Probe (branch engine-v2): engine v2 operations over the NATS store, in process, no HTTP; with time spent per store call.

    PYTHONPATH=src python bench/probes/engine_v2.py 5000
"""
import asyncio, sys, tempfile, time
from pathlib import Path
import nats
from seamq.dev.embedded import NatsServer
from seamq.jobs.nats_store import NatsJobStore
from seamq.jobs.operations import Operations
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
async def main():
    d = Path(tempfile.mkdtemp()); s = NatsServer(d / "nats"); s.start()
    try:
        nc = await nats.connect(s.url)
        store = await NatsJobStore(nc).start()
        ops = Operations(store)
        import collections, functools
        spent = collections.Counter(); calls = collections.Counter()
        def timed(name, fn):
            @functools.wraps(fn)
            async def w(*a, **k):
                t0 = time.perf_counter()
                try: return await fn(*a, **k)
                finally: spent[name] += time.perf_counter() - t0; calls[name] += 1
            return w
        for name in ("get", "commit", "offer", "take", "waiting", "settle", "arm", "hold"):
            setattr(store, name, timed(name, getattr(store, name)))
        t = time.perf_counter()
        for start in range(0, N, 200):
            await asyncio.gather(*(ops.push({"type": "t", "args": [i], "options": {"queue": "q"}}) for i in range(start, min(N, start + 200))))
        enq = N / (time.perf_counter() - t)
        done = 0
        async def loop():
            nonlocal done
            while done < N:
                jobs = await ops.fetch(["q"], 10, "w")
                if not jobs:
                    await asyncio.sleep(0.001); continue
                await asyncio.gather(*(ops.ack(j["id"]) for j in jobs))
                done += len(jobs)
        t = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(16)))
        for k, v in spent.most_common(): print(f"  {k}: {calls[k]} calls, {v:.2f} s total, {v/calls[k]*1000:.2f} ms each")
        print(f"engine v2 over NATS, in process: enqueue {enq:,.0f}/s, processed {N / (time.perf_counter() - t):,.0f}/s")
        await store.close(); await nc.close()
    finally:
        s.kill()
asyncio.run(main())
