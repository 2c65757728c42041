"""Probe (branch engine-v2): one, then two server processes of engine v2 on one nats-server take the
same queue; each job must be claimed and acked exactly once across them.

    PYTHONPATH=src python bench/probes/two_servers.py 10000
"""
import asyncio, multiprocessing as mp, sys, tempfile, time
from pathlib import Path

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000


def serve(url: str, start, results) -> None:
    async def main():
        import nats
        from seamq.jobs.nats_store import NatsJobStore
        from seamq.jobs.operations import Operations
        nc = await nats.connect(url)
        store = await NatsJobStore(nc).start()
        ops = Operations(store)
        start.wait()
        acked, idle = [], 0
        async def loop():
            nonlocal idle
            while idle < 20:
                jobs = await ops.fetch(["q"], 10, "w")
                if not jobs:
                    idle += 1
                    await asyncio.sleep(0.05)
                    continue
                idle = 0
                for j in jobs:
                    await ops.ack(j["id"])
                    acked.append(j["id"])
        t = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(16)))
        results.put((acked, time.perf_counter() - t - 1.0))
        await store.close(); await nc.close()
    asyncio.run(main())


async def fill(url: str) -> None:
    import nats
    from seamq.jobs.nats_store import NatsJobStore
    from seamq.jobs.operations import Operations
    nc = await nats.connect(url)
    ops = Operations(await NatsJobStore(nc).start())
    for s in range(0, N, 200):
        await asyncio.gather(*(ops.push({"type": "t", "args": [i], "options": {"queue": "q"}}) for i in range(s, min(N, s + 200))))
    await nc.close()


def run(servers: int) -> None:
    from seamq.dev.embedded import NatsServer
    d = Path(tempfile.mkdtemp()); nats_server = NatsServer(d / "nats"); nats_server.start()
    try:
        asyncio.run(fill(nats_server.url))
        start, results = mp.Event(), mp.Queue()
        procs = [mp.Process(target=serve, args=(nats_server.url, start, results)) for _ in range(servers)]
        for p in procs: p.start()
        time.sleep(2); start.set()
        got = [results.get(timeout=600) for _ in procs]
        for p in procs: p.join()
        ids = [i for acked, _ in got for i in acked]
        seconds = max(s for _, s in got)
        print(f"{servers} server(s): {len(ids)} acked, {len(set(ids))} distinct of {N}, {N / seconds:,.0f} jobs/s")
    finally:
        nats_server.kill()


if __name__ == "__main__":
    run(1)
    run(2)
