"""The same measurements for every job-queue peer, run inside the peer's own process (and, for Oban,
its own Python): a peer module gives an object with `durability`, `setup`, `enqueue`, `enqueue_batch`,
`enqueue_in`, `work` and `close`, and calls `main`. The result is one JSON line on stdout.

- enqueue, one job per call, 64 calls in flight;
- enqueue, 100 jobs per call, 8 calls in flight (where the library has a batch call);
- processed: both backlogs (2 x count no-op jobs) from the worker's start to the last job run, with
  16 jobs running at once, and the peer process's CPU per job over that time;
- scheduled: 300 jobs/s for 5 s, each due 1 s after its enqueue; lateness = the handler's start -
  the due time. Imports nothing of seamq (the Oban peer runs on another Python).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

CONCURRENCY = 64
WORKERS = 16


class Done:
    """What the peer's no-op handler reports: how many ran, and how late the scheduled ones started."""

    def __init__(self) -> None:
        self.count = 0
        self.late: list[float] = []
        self.event = asyncio.Event()
        self.target = 0

    def __call__(self, args: dict) -> None:
        self.count += 1
        if "due" in args:
            self.late.append((time.time() - args["due"]) * 1000)
        if self.count >= self.target:
            self.event.set()

    async def until(self, target: int, timeout: float) -> None:
        self.target = target
        if self.count < target:
            self.event.clear()
            await asyncio.wait_for(self.event.wait(), timeout)


async def _limited(calls, limit: int) -> None:
    calls = iter(calls)

    async def lane():
        for call in calls:
            await call()

    await asyncio.gather(*(lane() for _ in range(limit)))


def _q(values: list[float], q: int) -> float:
    return round(statistics.quantiles(values, n=100)[q - 1], 1) if len(values) > 1 else 0.0


async def measure(peer, count: int) -> dict:
    done = Done()
    await peer.setup(done)
    out: dict = {"durability": peer.durability}
    try:
        started = time.perf_counter()
        await _limited(((lambda n=n: peer.enqueue({"n": n})) for n in range(count)), CONCURRENCY)
        out["enqueue_single"] = round(count / (time.perf_counter() - started))
        batches = [[{"n": n} for n in range(start, min(count, start + 100))] for start in range(0, count, 100)]
        started = time.perf_counter()
        if getattr(peer, "has_batch", True):
            await _limited(((lambda b=b: peer.enqueue_batch(b)) for b in batches), 8)
            out["enqueue_batched"] = round(count / (time.perf_counter() - started))
        else:  # no batch call in the library: the same jobs one by one, not reported as a batch rate
            await _limited(((lambda n=n: peer.enqueue({"n": n})) for n in range(count)), CONCURRENCY)
        cpu, started = time.process_time(), time.perf_counter()
        await peer.work(WORKERS)
        await done.until(2 * count, timeout=900)
        out["processed"] = round(2 * count / (time.perf_counter() - started))
        out["cpu_us_per_job"] = round((time.process_time() - cpu) / (2 * count) * 1e6, 1)
        seconds, per_second, tick = (5.0, 300, 0.1) if count >= 10_000 else (2.0, 300, 0.1)
        begun = time.monotonic()
        for step in range(int(seconds / tick)):
            due = time.time() + 1.0
            await _limited(((lambda n=n, due=due: peer.enqueue_in({"n": n, "due": due}, 1.0))
                            for n in range(int(per_second * tick))), 8)
            await asyncio.sleep(max(0.0, begun + (step + 1) * tick - time.monotonic()))
        await done.until(2 * count + int(seconds / tick) * int(per_second * tick), timeout=120)
        out["late_p50_ms"], out["late_p99_ms"] = _q(done.late, 50), _q(done.late, 99)
        out["late_max_ms"] = round(max(done.late), 1)
    finally:
        await peer.close()
    return out


def main(peer) -> None:
    result = asyncio.run(measure(peer, int(os.environ.get("PEER_COUNT", "2000"))))
    print(json.dumps(result), flush=True)
