"""Probe: what the relay's publisher costs on a stream of 3 replicas, fast batch against one publish
each (pipelined), since the relay publishes to replicated streams one message at a time
(docs/benchmarks.md 1g). 20,000 messages of 200 bytes in claims of 500, as the relay sends them;
messages/s, and CPU per message of this process and of the three nats-servers (psutil).

    PYTHONPATH=src .venv/bin/python bench/probes/relay_publish_r3.py
"""
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import nats
import psutil

from seamq.embedded import NatsCluster
from seamq.model import OutMessage
from seamq.nats.fast_batch import FastBatchPublisher
from seamq.nats.publisher import PipelinedPublisher

COUNT, CLAIM = 20_000, 500


async def run(nc, publisher, servers, stream: str) -> str:
    me = psutil.Process()
    used = lambda ps: sum(sum(p.cpu_times()[:2]) for p in ps)  # noqa: E731
    body = b"x" * 200
    mine, theirs, started = used([me]), used(servers), time.perf_counter()
    for _ in range(0, COUNT, CLAIM):
        messages = [OutMessage(f"{stream.lower()}.e", body, {"Nats-Msg-Id": uuid.uuid4().hex}, stream)
                    for _i in range(CLAIM)]
        results = await publisher.publish_many(messages)
        assert all(r.ok for r in results), next(r for r in results if not r.ok)
    elapsed = time.perf_counter() - started
    mine, theirs = used([me]) - mine, used(servers) - theirs
    return (f"{COUNT / elapsed:,.0f} msgs/s, this process {mine / COUNT * 1e6:.0f} us/msg, "
            f"the 3 nats-servers {theirs / COUNT * 1e6:.0f} us/msg")


async def main() -> None:
    cluster = NatsCluster(Path(tempfile.mkdtemp()) / "c", 3)
    cluster.start()
    try:
        nc = await nats.connect(cluster.url.split(","))
        js = nc.jetstream()
        servers = [psutil.Process(n.proc.pid) for n in cluster.nodes]
        pipelined = await PipelinedPublisher(nc, timeout=10).start()
        for rounds in range(2):
            for kind in ("fast batch", "pipelined"):
                stream = f"R3{kind.split()[0].upper()}{rounds}"
                await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], num_replicas=3, allow_batched=True)
                publisher = (await FastBatchPublisher(nc, {stream}, pipelined, timeout=10).start()
                             if kind == "fast batch" else pipelined)
                print(f"{kind:>10}: {await run(nc, publisher, servers, stream)}", flush=True)
                if publisher is not pipelined:
                    await publisher.close()
        await pipelined.close()
        await nc.close()
    finally:
        cluster.kill()


if __name__ == "__main__":
    asyncio.run(main())
