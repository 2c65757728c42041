"""Probe: what nats-server spends on a job record's write, by how it is written: a plain
compare-and-set (a claim's or an ack's, sixteen on their way at once), in an atomic batch of 100 (a
recount's) or of fewer, and batches of 100 with a record cut to the few fields a count needs. nats-server's
CPU a write and writes/s; the record is a finished job's, as the bench's jobs are.

    PYTHONPATH=.:src .venv/bin/python bench/probes/record_writes.py 10000
"""
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.common import CpuWindow, NatsServer
from seamq.jobs import model

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000


def record(n: int, small: bool) -> dict:
    now = model.utcnow()
    full = {**model.new_record({"type": "bench.noop", "args": [n], "options": {"queue": "probe"}}, now),
            "state": "completed", "attempt": 1, "started_at": model.iso(now), "completed_at": model.iso(now),
            "worker_id": "w1", "_counted": "available"}
    return {k: full[k] for k in ("id", "queue", "state", "completed_at")} if small else full


async def main():
    import nats
    from seamq.jobs.nats_store import NatsJobStore
    from seamq.jobs.ports import Write

    with tempfile.TemporaryDirectory() as root:
        server = NatsServer(Path(root) / "nats")
        server.start()
        nc = await nats.connect(server.url)
        try:
            store = await NatsJobStore(nc).start()
            for name, together, small in (("plain CAS, 16 on their way", 0, False),
                                          ("atomic batches of 100", 100, False),
                                          ("atomic batches of 100, 4 fields", 100, True),
                                          ("atomic batches of 10", 10, False),
                                          ("atomic batches of 2", 2, False)):
                records = [record(n, small) for n in range(N)]
                keys = [r["id"] for r in records]
                revisions = [r[0] for r in await store.commit_each([[Write(k, r, 0)] for k, r in zip(keys, records)])]
                cpu = CpuWindow(nats=(server.proc.pid,))
                cpu.start()
                started = time.perf_counter()
                writes = [Write(k, r, rev, True) for k, r, rev in zip(keys, records, revisions)]
                if together:
                    for start in range(0, N, together):
                        await store.commit(writes[start:start + together])
                else:
                    for start in range(0, N, 16):
                        await store.commit_each([[w] for w in writes[start:start + 16]])
                seconds = time.perf_counter() - started
                used = cpu.end()["nats"]
                print(f"{name}: {N / seconds:,.0f} writes/s, nats-server {used / N * 1e6:.1f} us a write,"
                      f" {len(model.encode(records[0]))} bytes a record")
        finally:
            await nc.close()
            server.stop()


asyncio.run(main())
