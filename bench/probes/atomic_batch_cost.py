"""Probe: what one JetStream atomic batch costs nats-server, on a file stream and on a memory stream
(or, with --r3, on a file stream of 3 replicas in a cluster of 3), by its size, against a plain
publish (docs/benchmarks.md 7i). One connection, one batch at a time, 2 s per row; the servers' CPU
read with psutil.

    PYTHONPATH=src .venv/bin/python bench/probes/atomic_batch_cost.py [--r3]
"""
import asyncio, json, sys, tempfile, time, uuid
from pathlib import Path
import nats, psutil
from seamq.embedded import NatsCluster, NatsServer

R3 = "--r3" in sys.argv


async def rate(nc, servers, send) -> str:
    def used() -> float:
        return sum(sum(server.cpu_times()[:2]) for server in servers)
    n, cpu, started = 0, used(), time.perf_counter()
    while time.perf_counter() - started < 2:
        await send()
        n += 1
    elapsed, cpu = time.perf_counter() - started, used() - cpu
    return f"{n / elapsed:,.0f}/s, nats-server CPU {cpu / n * 1000:.2f} ms each, wall {elapsed / n * 1000:.2f} ms"


async def main():
    embedded = NatsCluster(Path(tempfile.mkdtemp()) / "c", 3) if R3 else NatsServer(Path(tempfile.mkdtemp()) / "nats")
    embedded.start()
    try:
        nodes = embedded.nodes if R3 else [embedded]
        nc, server = await nats.connect(embedded.url.split(",")), [psutil.Process(n.proc.pid) for n in nodes]
        for storage in ("file",) if R3 else ("file", "memory"):
            await nc.request(f"$JS.API.STREAM.CREATE.B{storage}", json.dumps(
                {"name": f"B{storage}", "subjects": [f"{storage}.>"], "storage": storage, "allow_atomic": True,
                 "num_replicas": 3 if R3 else 1}).encode(), timeout=10)
            for size in (1, 20):
                async def batch(size=size, storage=storage):
                    batch_id = uuid.uuid4().hex
                    for i in range(1, size + 1):
                        headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)}
                        if i < size:
                            await nc.publish(f"{storage}.k{i}", b"x" * 300, headers=headers)
                        else:
                            await nc.request(f"{storage}.k{i}", b"x" * 300, timeout=5,
                                             headers={**headers, "Nats-Batch-Commit": "1"})
                print(f"{storage} stream, atomic batch of {size}:", await rate(nc, server, batch))
            print(f"{storage} stream, plain publish:",
                  await rate(nc, server, lambda storage=storage: nc.request(f"{storage}.plain", b"x" * 300, timeout=5)))
        await nc.close()
    finally:
        embedded.kill()


asyncio.run(main())
