"""Probe: what one JetStream atomic batch costs nats-server, on a file stream and on a memory stream,
by its size, against a plain publish (docs/benchmarks.md 7i). One connection, one batch at a time,
2 s per row; the server's CPU read with psutil.

    PYTHONPATH=src .venv/bin/python bench/probes/atomic_batch_cost.py
"""
import asyncio, json, tempfile, time, uuid
from pathlib import Path
import nats, psutil
from seamq.embedded import NatsServer


async def rate(nc, server, send) -> str:
    n, cpu, started = 0, sum(server.cpu_times()[:2]), time.perf_counter()
    while time.perf_counter() - started < 2:
        await send()
        n += 1
    elapsed, cpu = time.perf_counter() - started, sum(server.cpu_times()[:2]) - cpu
    return f"{n / elapsed:,.0f}/s, nats-server CPU {cpu / n * 1000:.2f} ms each, wall {elapsed / n * 1000:.2f} ms"


async def main():
    embedded = NatsServer(Path(tempfile.mkdtemp()) / "nats")
    embedded.start()
    try:
        nc, server = await nats.connect(embedded.url), psutil.Process(embedded.proc.pid)
        for storage in ("file", "memory"):
            await nc.request(f"$JS.API.STREAM.CREATE.B{storage}", json.dumps(
                {"name": f"B{storage}", "subjects": [f"{storage}.>"], "storage": storage, "allow_atomic": True}).encode())
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
