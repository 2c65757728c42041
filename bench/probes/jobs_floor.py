"""Probe: the NATS traffic `seamq jobs worker --nats` makes for each job, with no engine around it: the
floor any worker on nats-py stands on when it keeps seamq's records, whatever its engine does.

N records wait in a KV-like stream (direct gets, one message per key, atomic batches allowed) and N
entries in a work stream. C loops each take rounds of up to 3 jobs, as the native worker's fetches
do at 16 at once: read the queue's priorities as last stored (one `STREAM.MSG.GET`), pull entries
(`CONSUMER.MSG.NEXT`), read their records in one batched direct get, claim each with a
compare-and-set and wait for it, then hand the ack (a compare-and-set of the record) to one gatherer
that stores what came in the last 50 ms as one atomic batch, and ack the entry. Records are JSON
through orjson (seamq.codec), requests through seamq.nats.replies, as the engine's.

    PYTHONPATH=.:src .venv/bin/python bench/probes/jobs_floor.py [N] [C] [--sync always]
"""
import asyncio, resource, sys, time, uuid

import nats

from bench.common import CpuWindow, services
from seamq import codec
from seamq.jobs.nats_ready import _PullInbox
from seamq.nats.replies import Replies, acked
from seamq.nats.wire import header_block

N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 10000
LOOPS = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 6
SYNC = sys.argv[sys.argv.index("--sync") + 1] if "--sync" in sys.argv else "default"
ROUND = 3  # jobs a fetch claims, as the native worker's at 16 at once (10,000 jobs in about 3,200 fetches)
ACK_WAIT = 0.05
RECORD = {"type": "bench.noop", "queue": "floor", "args": [1, "a"], "state": "available", "priority": 0,
          "attempt": 0, "max_attempts": 3, "created_at": "2026-12-06T05:00:00.000Z",
          "enqueued_at": "2026-12-06T05:00:00.000Z", "meta": {}}


def expecting(revision: int, **more: str) -> bytes:
    return header_block({"Nats-Expected-Last-Subject-Sequence": str(revision), **more})


class Acks:
    """Acks gathered for ACK_WAIT, then stored as one atomic batch (the engine's seamq.jobs.tallied)."""

    def __init__(self, replies: Replies) -> None:
        self.replies, self.waiting, self.batches = replies, [], 0

    def add(self, key: str, record: dict, revision: int) -> None:
        self.waiting.append((key, codec.dumps(record), revision))

    async def run(self, done) -> None:
        while not done() or self.waiting:
            await asyncio.sleep(ACK_WAIT)
            group, self.waiting = self.waiting[:999], self.waiting[999:]
            if not group:
                continue
            batch = uuid.uuid4().hex
            for index, (key, payload, revision) in enumerate(group, 1):
                headers = expecting(revision, **{"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(index)},
                                    **({"Nats-Batch-Commit": "1"} if index == len(group) else {}))
                if index < len(group):
                    await self.replies.wire.publish(f"$KV.F.{key}", payload, headers=headers)
                else:
                    answer = acked(await self.replies.request(f"$KV.F.{key}", payload, headers, timeout=30))
                    assert "error" not in answer, answer
            self.batches += 1


async def main():
    with services(nats_sync=SYNC) as svc:
        nc = await nats.connect(svc.nats.url)
        js = nc.jetstream()
        await js.add_stream(name="KV_F", subjects=["$KV.F.>"], allow_direct=True, max_msgs_per_subject=1,
                            allow_atomic=True)
        await js.add_stream(name="WORK", subjects=["work.>"], retention="workqueue")
        await js.add_consumer("WORK", durable_name="floor", ack_policy="explicit", max_ack_pending=-1)
        replies = await Replies(nc).start()
        for n in range(N):
            await replies.wire.publish(f"$KV.F.j{n}", codec.dumps({**RECORD, "id": f"j{n}"}))
            await replies.wire.publish(f"work.floor.j{n}", b"")
        await nc.flush()
        finished, acks = 0, Acks(replies)

        async def claim(key: str, record: dict, revision: int, entry: str) -> None:
            nonlocal finished
            record = {**record, "state": "active", "attempt": 1, "started_at": "2026-12-06T05:00:01.000Z"}
            answer = acked(await replies.request(f"$KV.F.{key}", codec.dumps(record), expecting(revision)))
            assert "error" not in answer, answer
            acks.add(key, {**record, "state": "completed", "completed_at": "2026-12-06T05:00:01.000Z"}, answer["seq"])
            await nc.publish(entry, b"+ACK")
            finished += 1

        async def loop() -> None:
            inbox = await _PullInbox.open(nc)  # deliveries keep their own subjects (the engine's inbox)
            while finished < N:
                await replies.request("$JS.API.STREAM.MSG.GET.KV_F", b'{"last_by_subj":"$KV.F.j0"}')
                await nc.publish("$JS.API.CONSUMER.MSG.NEXT.WORK.floor", b'{"batch":%d,"no_wait":true}' % ROUND,
                                 reply=inbox.subject)
                entries = []
                while len(entries) < ROUND:  # a full pull ends with its last entry, no status after it
                    entry = await inbox.next()
                    if entry.headers and entry.headers.get("Status"):
                        break
                    entries.append(entry)
                if not entries:
                    await asyncio.sleep(0.005)
                    continue
                keys = {m.subject.rsplit(".", 1)[1]: m.reply for m in entries}
                held = [(m.headers["Nats-Subject"].removeprefix("$KV.F."), codec.loads(m.data), int(m.headers["Nats-Sequence"]))
                        async for m in replies.answers("$JS.API.DIRECT.GET.KV_F", codec.dumps(
                            {"multi_last": [f"$KV.F.{k}" for k in keys], "batch": len(keys)}), ends=("204", "404"))]
                await asyncio.gather(*(claim(key, record, revision, keys[key]) for key, record, revision in held))

        cpu = CpuWindow(nats=(svc.nats.proc.pid,))
        cpu.start()
        own, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(acks.run(lambda: finished >= N), *(loop() for _ in range(LOOPS)))
        elapsed, used, mine = time.perf_counter() - started, cpu.end(), resource.getrusage(resource.RUSAGE_SELF)
        used["worker"] = mine.ru_utime + mine.ru_stime - own.ru_utime - own.ru_stime
        print(f"{finished / elapsed:,.0f} jobs/s ({acks.batches} ack batches); "
              + ", ".join(f"{k} {v / finished * 1e6:.0f} us/job" for k, v in used.items()), flush=True)
        await replies.close()
        await nc.close()


asyncio.run(main())
