"""Probe: FastStream's JetStream pull subscriber alone on N waiting messages (the peer scenario's
settings: batches of 500, a no-op handler, no per-message log): its rate and its CPU per message
(this process; it also polls JetStream for the ack floor every 0.1 s).

    PYTHONPATH=. .venv/bin/python bench/probes/faststream_peer.py 100000
"""
import asyncio, sys, time
from bench.common import bench_topology, provision, publish_events, services, wait_until
from bench.peer import STREAM, all_acked
from seamq.topology import load_topology

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100000


async def main():
    from faststream.nats import JStream, NatsBroker, PullSub

    with services() as svc:
        await provision(svc.nats.url, load_topology(bench_topology(svc.root)))
        await publish_events(svc.nats.url, N, 256)
        broker = NatsBroker(svc.nats.url, logger=None)

        @broker.subscriber("vibespro.event.>", stream=JStream(STREAM, declare=False), durable="faststream_probe",
                           pull_sub=PullSub(batch_size=500, timeout=1.0))
        async def handle(body: dict) -> None:
            pass

        cpu, started = time.process_time(), time.perf_counter()
        await broker.start()
        await wait_until(lambda: all_acked(svc.nats.url, "faststream_probe", N), timeout=600, interval=0.1)
        elapsed = time.perf_counter() - started
        print(f"{N / elapsed:.0f} msgs/s, {(time.process_time() - cpu) / N * 1e6:.1f} us of CPU per message")
        await broker.stop()


asyncio.run(main())
