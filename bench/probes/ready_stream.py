"""Probe for issue 29 (job servers without an in-memory index): how fast one process claims and
finishes jobs through a JetStream work-queue "ready" stream + KV compare-and-set, against today's
engine (its index), both in-process on one nats-server, no HTTP.

    python -m bench.probes.ready_stream 10000 [--nak | --leases]

--nak: the lease is the ready message held unacked (`-NAK {"delay"}`, acked at the end);
--leases: the lease is an `@at` schedule per job, purged at the end. Numbers in the issue's note.
"""
import asyncio, json, sys, tempfile, time
from pathlib import Path
import nats
from nats.js.api import StreamConfig, RetentionPolicy, ConsumerConfig, AckPolicy, KeyValueConfig, StorageType
from seamq.dev.embedded import NatsServer
from seamq.jobs.model import uuid7

N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20000
LOOPS = 16
LEASES = '--leases' in sys.argv
NAKLEASE = '--nak' in sys.argv

async def proto(url):
    nc = await nats.connect(url)
    js = nc.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket="P_JOBS", history=1, storage=StorageType.FILE))
    await js.add_stream(StreamConfig(name="P_READY", subjects=["ready.>"], retention=RetentionPolicy.WORK_QUEUE,
                                     storage=StorageType.FILE))
    await js.add_consumer("P_READY", ConsumerConfig(durable_name="q-p100", filter_subject="ready.q.p100",
                                                    ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=10000))
    t = time.perf_counter()
    for start in range(0, N, 200):
        async def one(i):
            jid = uuid7()
            rec = {"id": jid, "type": "t", "queue": "q", "args": [i], "state": "available", "attempt": 0}
            data = json.dumps(rec).encode()
            rev = await kv.create(jid, data)
            await js.publish("ready.q.p100", json.dumps({"rev": rev, "rec": rec}).encode())
        await asyncio.gather(*(one(i) for i in range(start, min(N, start + 200))))
    enq = N / (time.perf_counter() - t)
    done = 0
    async def loop():
        nonlocal done
        sub = await js.pull_subscribe("ready.q.p100", durable="q-p100", stream="P_READY")
        while done < N:
            await js.stream_info("P_READY", subjects_filter="ready.q.>")  # which priorities wait
            try:
                msgs = await sub.fetch(10, timeout=0.5)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                continue
            async def claim_and_ack(m):
                nonlocal done
                body = json.loads(m.data)
                rec = {**body["rec"], "state": "active", "attempt": 1}
                if NAKLEASE:
                    rec["_reply"] = m.reply
                try:
                    rev = await kv.update(rec["id"], json.dumps(rec).encode(), last=body["rev"])
                except Exception:
                    await m.ack(); return
                if NAKLEASE:  # the lease: the ready message held, redelivered after 60 s unless acked
                    await nc.publish(m.reply, b'-NAK {"delay": 60000000000}')
                else:
                    await m.ack()
                if LEASES:  # the lease as a durable timer, replaced by each heartbeat, dropped at the ack
                    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
                    await js.publish(f"sched.lease.{rec['id']}", b"{}", headers={"Nats-Schedule": f"@at {at}",
                                     "Nats-Schedule-Target": f"fire.lease.{rec['id']}"})
                # the worker runs it; then ack: CAS to completed + a done marker
                await kv.update(rec["id"], json.dumps({**rec, "state": "completed"}).encode(), last=rev)
                await js.publish(f"done.q.completed", rec["id"].encode())
                if NAKLEASE:
                    await nc.publish(rec["_reply"], b"+ACK")
                if LEASES:
                    await js.purge_stream("P_TIMERS", subject=f"sched.lease.{rec['id']}")
                done += 1
            await asyncio.gather(*(claim_and_ack(m) for m in msgs))
    await js.add_stream(StreamConfig(name="P_DONE", subjects=["done.>"], storage=StorageType.FILE))
    await js.add_stream(StreamConfig(name="P_TIMERS", subjects=["sched.>", "fire.>"], allow_msg_schedules=True,
                                     max_msgs_per_subject=1, storage=StorageType.FILE))
    t = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(LOOPS)))
    proc = N / (time.perf_counter() - t)
    await nc.close()
    return enq, proc

async def today(url):
    from seamq.jobs.engine import Engine
    from seamq.jobs.store import JobStore
    nc = await nats.connect(url)
    engine = await Engine(await JobStore(nc).start()).start()
    t = time.perf_counter()
    for start in range(0, N, 1000):
        await engine.push_batch({"jobs": [{"type": "t", "args": [i], "options": {"queue": "q"}} for i in range(start, min(N, start + 1000))]})
    enq = N / (time.perf_counter() - t)
    done = 0
    async def loop():
        nonlocal done
        while done < N:
            jobs = await engine.fetch(["q"], 10, "w")
            if not jobs:
                await asyncio.sleep(0.001); continue
            await asyncio.gather(*(engine.ack(j["id"]) for j in jobs))
            done += len(jobs)
    t = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(LOOPS)))
    proc = N / (time.perf_counter() - t)
    await engine.stop(); await nc.close()
    return enq, proc

async def main():
    for name, fn in (("today (index)", today), ("stateless (ready stream + CAS)", proto)):
        d = Path(tempfile.mkdtemp())
        s = NatsServer(d / "nats"); s.start()
        try:
            enq, proc = await fn(s.url)
            print(f"{name}: enqueue {enq:,.0f}/s (today: batched 1000; proto: one by one, 200 in flight), processed {proc:,.0f}/s", flush=True)
        finally:
            s.kill()
asyncio.run(main())
