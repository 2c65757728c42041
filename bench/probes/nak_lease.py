"""Probe for issue 29: a JetStream message held unacked as a job's lease. `-NAK {"delay": d}` makes
it come again after d unless acked first; a second NAK extends it; an ACK (from any connection, to
the reply subject kept in the job's record) ends it. nats-py refuses an ack after a nak on the same
Msg object, so the protocol is spoken directly.

    python -m bench.probes.nak_lease
"""
import asyncio, json, tempfile, time
from pathlib import Path
import nats
from nats.js.api import StreamConfig, RetentionPolicy, ConsumerConfig, AckPolicy, StorageType
from seamq.embedded import NatsServer

async def nak(nc, m, delay):
    await nc.publish(m.reply, b"-NAK " + json.dumps({"delay": int(delay * 1e9)}).encode())
async def ack(nc, m):
    await nc.request(m.reply, b"+ACK", timeout=2)  # double ack: the server confirms

async def main():
    d = Path(tempfile.mkdtemp()); s = NatsServer(d / "nats"); s.start()
    try:
        nc = await nats.connect(s.url); js = nc.jetstream()
        await js.add_stream(StreamConfig(name="R", subjects=["r.>"], retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE))
        await js.add_consumer("R", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=-1))
        sub = await js.pull_subscribe("r.>", durable="c", stream="R")
        other = await js.pull_subscribe("r.>", durable="c", stream="R")
        async def get(sub, t=0.3):
            try: return await sub.fetch(1, timeout=t)
            except (nats.errors.TimeoutError, asyncio.TimeoutError): return []
        # 1: hold with nak(delay) as the lease, then ack before it ends
        await js.publish("r.a", b"a")
        [m] = await get(sub)
        await nak(nc, m, 1.0)
        await asyncio.sleep(0.5)
        await ack(nc, m)
        await asyncio.sleep(1.0)
        print("1. nak(1s) then ack at 0.5s -> redelivered?", [x.data for x in await get(other)])
        # 2: lease 1s, no ack -> another gets it after ~1s
        await js.publish("r.b", b"b")
        [m] = await get(sub)
        t = time.monotonic(); await nak(nc, m, 1.0)
        got = []
        while not got: got = await get(other, 0.2)
        print(f"2. nak(1s), no ack -> redelivered after {time.monotonic()-t:.2f}s, delivered count {got[0].metadata.num_delivered}")
        await ack(nc, got[0])
        # 3: extend: nak(1s) again at 0.7s (a heartbeat), ack at 1.5s
        await js.publish("r.c", b"c")
        [m] = await get(sub)
        await nak(nc, m, 1.0); await asyncio.sleep(0.7); await nak(nc, m, 1.0); await asyncio.sleep(0.8)
        early = await get(other, 0.1)
        await ack(nc, m); await asyncio.sleep(1.2)
        print("3. extended by a second nak: taken by another meanwhile?", [x.data for x in early], "after ack:", [x.data for x in await get(other)])
        info = await js.consumer_info("R", "c"); print("pending", info.num_pending, "ack pending", info.num_ack_pending)
        await nc.close()
    finally:
        s.kill()
asyncio.run(main())
