"""Probe: what sending an aggregate's messages in waves costs the pipelined publisher (the relay's
path on a replicated stream, or on a server without fast batches; docs/benchmarks.md 1j). 20,000
messages of 200 bytes in claims of 500, spread over N aggregates (keys), or with no key (as before
waves); one server and a stream of 3 replicas. Messages/s.

    PYTHONPATH=src .venv/bin/python bench/probes/relay_waves.py
"""
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import nats

from seamq.embedded import NatsCluster, NatsServer
from seamq.model import OutMessage
from seamq.nats.publisher import PipelinedPublisher

COUNT, CLAIM = 20_000, 500
SPREADS = (None, 1000, 50, 5)  # aggregates; None: no key


async def rate(publisher, subject: str, aggregates: int | None) -> float:
    body = b"x" * 200
    started = time.perf_counter()
    for claim in range(0, COUNT, CLAIM):
        messages = [OutMessage(subject, body, {"Nats-Msg-Id": uuid.uuid4().hex},
                               key=None if aggregates is None else ("order", str((claim + i) % aggregates)))
                    for i in range(CLAIM)]
        results = await publisher.publish_many(messages)
        assert all(r.ok for r in results), next(r for r in results if not r.ok)
    return COUNT / (time.perf_counter() - started)


async def probe(url: str, replicas: int) -> None:
    nc = await nats.connect(url.split(","))
    js = nc.jetstream()
    publisher = await PipelinedPublisher(nc, timeout=10).start()
    for rounds in range(2):
        for aggregates in SPREADS:
            stream = f"W{replicas}{rounds}{aggregates or 0}"
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], num_replicas=replicas)
            got = await rate(publisher, f"{stream.lower()}.e", aggregates)
            print(f"R{replicas} {'no key' if aggregates is None else f'{aggregates} aggregates':>14}: "
                  f"{got:,.0f} msgs/s", flush=True)
    await publisher.close()
    await nc.close()


async def main() -> None:
    root = Path(tempfile.mkdtemp())
    server = NatsServer(root / "one")
    server.start()
    try:
        await probe(server.url, 1)
    finally:
        server.kill()
    cluster = NatsCluster(root / "c", 3)
    cluster.start()
    try:
        await probe(cluster.url, 3)
    finally:
        cluster.kill()


if __name__ == "__main__":
    asyncio.run(main())
