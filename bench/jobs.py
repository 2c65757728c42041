"""Scenario 7: the OJS job server (`seamq jobs serve`) next to its raw parts and to procrastinate.

Raw baselines, same nats-server: KV creates and CAS updates (what every push and every transition
costs at least) and `@at` schedule publishes (every timer). Then the server over HTTP, one aiohttp
client like a user's: enqueue one job per request (64 in flight) and 100 per batch request; processed
end to end (16 workers, each fetching 10 and acking them one by one); timer lateness with 300 jobs/s
scheduled 1 s ahead; processed with two servers on the same NATS; peak RSS with 10k, 100k and 1M jobs
waiting, and the time a restart takes with them.
The job queues users would install instead are in bench/peers_jobs.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import nats

from bench.common import Result, peak_rss_mb, services
from seamq.embedded import NatsServer
from seamq.jobs.model import parse_time

CONCURRENCY = 64
WORKERS = 16


def _rate(count: int, started: float) -> float:
    return count / (time.perf_counter() - started)


async def _gather_limited(calls, limit: int) -> list:
    """Run coroutine factories with at most `limit` in flight."""
    calls = iter(calls)
    out = []

    async def lane():
        for call in calls:
            out.append(await call())

    await asyncio.gather(*(lane() for _ in range(limit)))
    return out


# ---- raw baselines ---------------------------------------------------------------------------------

async def raw_baselines(nats_url: str, count: int) -> dict[str, float]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket="RAW_BENCH", history=1)
    record = json.dumps({"id": "x" * 36, "type": "bench.noop", "queue": "default", "args": [1],
                         "state": "available", "attempt": 0, "priority": 0}).encode()
    keys = [f"k{n}" for n in range(count)]
    started = time.perf_counter()
    revisions = await _gather_limited(((lambda key=key: kv.create(key, record)) for key in keys), CONCURRENCY)
    create = _rate(count, started)
    started = time.perf_counter()
    await _gather_limited(((lambda key=key, rev=rev: kv.update(key, record, last=rev))
                           for key, rev in zip(keys, revisions)), CONCURRENCY)
    cas = _rate(count, started)
    await js.add_stream(name="RAW_SCHED", subjects=["raw.sched.>", "raw.fire.>"], allow_msg_schedules=True)
    at = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("@at %Y-%m-%dT%H:%M:%SZ")
    started = time.perf_counter()
    await _gather_limited(((lambda n=n: js.publish(f"raw.sched.{n}", b"{}", headers={
        "Nats-Schedule": at, "Nats-Schedule-Target": f"raw.fire.{n}"})) for n in range(count)), CONCURRENCY)
    schedule = _rate(count, started)
    await nc.close()
    return {"kv_create": create, "kv_cas": cas, "schedule": schedule}


# ---- seamq jobs serve --------------------------------------------------------------------------------

def _job(n: int, queue: str = "bench", **options) -> dict:
    return {"type": "bench.noop", "args": [n], "options": {"queue": queue, **options}}


class Http:
    def __init__(self, url: str) -> None:
        self.url = url + "/ojs/v1"
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY * 2))

    async def call(self, path: str, body: dict | None = None, method: str = "POST") -> dict:
        async with self.session.request(method, self.url + path, json=body) as response:
            payload = await response.json()
            if response.status >= 300:
                raise RuntimeError(f"{path}: {response.status} {payload}")
            return payload

    async def close(self) -> None:
        await self.session.close()


async def enqueue_single(http: Http, count: int, queue: str) -> float:
    started = time.perf_counter()
    await _gather_limited(((lambda n=n: http.call("/jobs", _job(n, queue))) for n in range(count)), CONCURRENCY)
    return _rate(count, started)


async def enqueue_batched(http: Http, count: int, queue: str, size: int = 100, **options) -> float:
    started = time.perf_counter()
    batches = [[_job(n, queue, **options) for n in range(start, min(count, start + size))]
               for start in range(0, count, size)]
    await _gather_limited(((lambda b=b: http.call("/jobs/batch", {"jobs": b})) for b in batches), 8)
    return _rate(count, started)


async def process(http: Http | list[Http], count: int, queue: str) -> float:
    """16 workers (spread over the servers when several): fetch up to 10, ack each; until `count` jobs
    are acked."""
    servers = http if isinstance(http, list) else [http]
    done = 0

    async def worker(name: str, http: Http) -> None:
        nonlocal done
        while done < count:
            jobs = (await http.call("/workers/fetch", {"queues": [queue], "count": 10, "worker_id": name}))["jobs"]
            if not jobs:
                await asyncio.sleep(0.005)
            for job in jobs:
                await http.call("/workers/ack", {"job_id": job["id"], "result": None})
                done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(f"w{n}", servers[n % len(servers)]) for n in range(WORKERS)))
    return _rate(count, started)


async def lateness(http: Http, seconds: float, server_log: Path, per_second: int = 300) -> list[float]:
    """Push `per_second` jobs/s each due 1 s later; four tight fetchers note when each comes out.
    Lateness = fetched - scheduled_at: the timer's lateness plus at most one fetch round trip."""
    total = int(seconds * per_second)
    late: list[float] = []
    pushed: list[str] = []
    fetched: set[str] = set()

    async def producer() -> None:
        tick = 0.1
        for _ in range(int(seconds / tick)):
            due = datetime.now(timezone.utc) + timedelta(seconds=1)
            batch = [_job(n, "timed", scheduled_at=due.isoformat()) for n in range(int(per_second * tick))]
            pushed.extend(job["id"] for job in (await http.call("/jobs/batch", {"jobs": batch}))["jobs"])
            await asyncio.sleep(max(0.0, tick - (datetime.now(timezone.utc) - due + timedelta(seconds=1))
                                    .total_seconds()))

    async def fetcher(name: str) -> None:
        while len(late) < total:
            jobs = (await http.call("/workers/fetch", {"queues": ["timed"], "count": 50, "worker_id": name}))["jobs"]
            now = datetime.now(timezone.utc)
            for job in jobs:
                late.append((now - parse_time(job["scheduled_at"])).total_seconds() * 1000)
                fetched.add(job["id"])
            await asyncio.gather(*(http.call("/workers/ack", {"job_id": job["id"]}) for job in jobs))
            if not jobs:
                await asyncio.sleep(0.002)

    try:
        await asyncio.wait_for(asyncio.gather(producer(), *(fetcher(f"t{n}") for n in range(4))), seconds + 60)
    except asyncio.TimeoutError:  # which jobs never came out, as the server holds them now
        missing = [job_id for job_id in pushed if job_id not in fetched]
        held = [(await http.call(f"/jobs/{job_id}", method="GET"))["job"] for job_id in missing[:3]]
        said = server_log.read_text(errors="replace").splitlines()[-10:]  # it logs warnings and errors only
        raise RuntimeError(f"{len(fetched)} of {len(pushed)} timed jobs fetched in {seconds + 60:.0f} s; "
                           f"{len(missing)} never: {held}; the server's log ends: {said}") from None
    return late


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


async def server_scenarios(svc, count: int, waiting: int, result: Result, raw: dict) -> dict[str, float]:
    from seamq.embedded import JobServer

    server = JobServer(svc.nats.url, svc.root / "jobs-server.log", test_mode=True).start()
    http = Http(server.url)
    rates: dict[str, float] = {}
    try:
        rates["single"] = await enqueue_single(http, count, "bench")
        result.add(case="enqueue, 1 job per request (64 in flight)", jobs_per_s=round(rates["single"]),
                   target=">= 2000", vs_raw=f"{rates['single'] / raw['kv_create']:.2f} of KV create")
        rates["batched"] = await enqueue_batched(http, count, "bench2")
        result.add(case="enqueue, 100 per batch request (8 in flight)", jobs_per_s=round(rates["batched"]),
                   target=">= 8000", vs_raw=f"{rates['batched'] / raw['kv_create']:.2f} of KV create")
        rates["processed"] = await process(http, count, "bench")
        result.add(case=f"processed end to end over HTTP ({WORKERS} workers, fetch 10, ack 1 by 1)",
                   jobs_per_s=round(rates["processed"]), target=">= 1200",
                   vs_raw=f"{rates['processed'] / raw['kv_cas']:.2f} of KV CAS (2 CAS per job)")
        late = await lateness(http, 5.0 if count >= 10_000 else 2.0, svc.root / "jobs-server.log")
        rates["late_p99"] = _p(late, 99)
        result.add(case=f"timer lateness, 300 jobs/s due 1 s ahead ({len(late)} jobs), p50/p99/max ms",
                   jobs_per_s=300, target="p99 < 30 ms",
                   vs_raw=f"{_p(late, 50):.1f} / {rates['late_p99']:.1f} / {max(late):.1f}")
        # A second server on the same NATS: the same jobs, the workers spread over both.
        second = JobServer(svc.nats.url, svc.root / "jobs-server-2.log", test_mode=True).start()
        other = Http(second.url)
        try:
            await enqueue_batched(http, count, "two")
            rates["two"] = await process([http, other], count, "two")
        finally:
            await other.close()
            second.stop()
        result.add(case=f"processed end to end, two servers ({WORKERS // 2} workers on each)",
                   jobs_per_s=round(rates["two"]), target="-", vs_raw=f"{rates['two'] / rates['processed']:.2f} of one")
        # A new server process on emptied streams: its peak as the backlog grows, then after a restart.
        await http.call("/admin/reset", {})
        server.stop()
        server.start()
        await http.close()
        http = Http(server.url)  # the old one's kept-alive connections went with the old process
        held = 0
        for level in waiting:
            loaded = await enqueue_batched(http, level - held, f"waiting-{level}", size=999)
            held = level
            rss = peak_rss_mb(server.proc.pid)
            result.add(case=f"server peak RSS, {level:,} jobs waiting (enqueued 1,000 per batch; MB)",
                       jobs_per_s=round(loaded), target="< 200 MB", vs_raw=f"{rss:.0f} MB")
            rates[f"rss_{level}"] = rss
        server.stop()
        started = time.perf_counter()
        server.start()
        result.rows[-1]["vs_raw"] += (f"; restarted with them in {time.perf_counter() - started:.1f} s, "
                                      f"{peak_rss_mb(server.proc.pid):.0f} MB (it reads no job)")
    finally:
        await http.close()
        server.stop()
    return rates


async def processed_synced(svc, count: int) -> float:
    """Processed end to end with nats-server fsyncing every write, as PostgreSQL does every commit."""
    from seamq.embedded import JobServer

    nats_server = NatsServer(svc.root / "nats-synced", sync="always")
    nats_server.start()
    server = JobServer(nats_server.url, svc.root / "jobs-synced.log").start()
    http = Http(server.url)
    try:
        await enqueue_batched(http, count, "synced")
        return await process(http, count, "synced")
    finally:
        await http.close()
        server.stop()
        nats_server.stop()


def draining_worker(client, queue: str, count: int, concurrency: int):
    """seamq's worker over `client` (a JobsClient, or seamq.jobs.native's EngineClient) with a no-op
    function, `concurrency` jobs at once, stopping once it has acked `count` jobs."""
    from seamq.jobs.worker import Worker, WorkerConfig

    async def noop(*args, **kwargs) -> None:
        return None

    worker = Worker(client, noop, WorkerConfig(queues=(queue,), concurrency=concurrency, idle_wait=0.05))
    done, ack = 0, client.ack

    async def counted(*args, **kwargs):
        answer = await ack(*args, **kwargs)
        one_done()
        return answer

    def counted_soon(*args, **kwargs):
        future = ack_soon(*args, **kwargs)
        future.add_done_callback(lambda f: one_done() if not f.cancelled() and f.exception() is None else None)
        return future

    def one_done() -> None:
        nonlocal done
        done += 1
        if done >= count:
            worker.stop()

    client.ack = counted
    if hasattr(client, "ack_soon"):
        ack_soon, client.ack_soon = client.ack_soon, counted_soon
    return worker


async def processed_native(nats_url: str, count: int, queue: str, concurrency: int = WORKERS) -> float:
    """`count` jobs waiting, processed by seamq's worker with the engine in its own process (`seamq jobs
    worker --nats`: seamq.jobs.native), `concurrency` no-op jobs at once, as the peers run theirs."""
    from seamq.jobs.engine import Engine
    from seamq.jobs.nats_store import NatsJobStore
    from seamq.jobs.native import EngineClient, collect_less, started_engine

    nc = await nats.connect(nats_url)
    producer = await Engine(await NatsJobStore(nc).start()).start(clocks=False)  # as an application's, apart
    for start in range(0, count, 999):
        await producer.ops.push_batch({"jobs": [{"type": "noop", "args": [n], "options": {"queue": queue}}
                                                for n in range(start, min(count, start + 999))]})
    await producer.stop()
    engine = await started_engine(nc)
    gc_was = gc.get_threshold()
    collect_less()  # as `seamq jobs worker --nats` does once started
    worker = draining_worker(EngineClient(engine), queue, count, concurrency)
    try:
        started = time.perf_counter()
        await worker.run()
        return _rate(count, started)
    finally:
        gc.unfreeze()
        gc.set_threshold(*gc_was)
        await engine.stop()
        await nc.close()


# ---- the scenario ------------------------------------------------------------------------------------

async def run(count: int, size: int) -> Result:
    result = Result("jobs")
    count = min(count, 20_000)
    waiting = [10_000, 100_000, 1_000_000] if count >= 10_000 else [2_000, 10_000]
    with services() as svc:
        raw = await raw_baselines(svc.nats.url, count)
        for name, label in [("kv_create", "raw: KV create (nats-py, 64 in flight)"),
                            ("kv_cas", "raw: KV update with expected revision (64 in flight)"),
                            ("schedule", "raw: `@at` schedule publish (64 in flight)")]:
            result.add(case=label, jobs_per_s=round(raw[name]), target="-", vs_raw="1.00")
        ours = await server_scenarios(svc, count, waiting, result, raw)
        synced = await processed_synced(svc, count)
        result.add(case="processed end to end, nats-server fsync on every write (sync: always)",
                   jobs_per_s=round(synced), target="-",
                   vs_raw=f"{synced / ours['processed']:.2f} of the default (fsync every 2 min)")
    result.notes.append("the job queues users would install instead are measured beside seamq in `peers_jobs`")
    result.notes.append("one aiohttp client in the bench process drives the server over HTTP on the same 2 cores; "
                        "RSS is the server's VmHWM")
    return result
