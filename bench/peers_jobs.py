"""Scenario `peers_jobs`: seamq's jobs next to the Python job queues users would install instead,
measured the same way in the same run (bench/peers/jobs_driver.py): enqueue one by one and in
batches of 100, processed/s with 16 no-op jobs at once, and how late a job due in 1 s starts.

seamq twice: workers that reach `seamq jobs serve` over HTTP, as OJS workers do (one fetch per 10
jobs, one ack per job), and `seamq jobs worker --nats`, the engine in the worker's own process, as
every peer runs its handler in the process that reads the queue; the peers are compared with the
latter. Each peer runs in a process of its own on the same PostgreSQL (procrastinate, PgQueuer,
Oban) or on Redis (saq, arq); Oban needs Python >= 3.12 and runs from .venv-oban, which `make bench` makes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from bench.common import Result, services
from bench.jobs import (WORKERS, Http, _p, enqueue_batched, enqueue_single, lateness, process, processed_native,
                        processed_synced)
from seamq.embedded import NatsServer
from seamq.embedded import free_port

NATIVE = "seamq jobs worker --nats (the engine in the worker), 16 at once"  # what the peers are measured against
OBAN_PYTHON = Path(__file__).parent.parent / ".venv-oban" / "bin" / "python"
PEERS = [  # (name, module, needs)
    ("procrastinate 3", "bench.peers.jobs_procrastinate", "postgres"),
    ("PgQueuer 1.6", "bench.peers.jobs_pgqueuer", "postgres"),
    ("Oban for Python 0.6", "bench.peers.jobs_oban", "postgres"),
    ("saq 0.26 (Redis)", "bench.peers.jobs_saq", "redis"),
    ("arq 0.28 (Redis)", "bench.peers.jobs_arq", "redis"),
]


@contextmanager
def redis_server(root: Path):
    """Debian's redis-server on a free loopback port, as Debian configures durability (RDB snapshots,
    no append-only file); None when it is not installed."""
    binary = shutil.which("redis-server")
    if not binary:
        yield None
        return
    port, folder = free_port(), root / "redis"
    folder.mkdir()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                             "--save", "3600 1 300 100 60 10000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def seamq_row(svc, count: int) -> dict:
    from seamq.embedded import JobServer

    server = JobServer(svc.nats.url, svc.root / "peers-jobs-server.log", test_mode=True).start()
    http = Http(server.url)
    try:
        row = {"durability": "JetStream file storage, fsync every 2 min (nats-server's default)",
               "enqueue_single": round(await enqueue_single(http, count, "peers")),
               "enqueue_batched": round(await enqueue_batched(http, count, "peers"))}
        row["processed"] = round(await process(http, 2 * count, "peers"))
        late = await lateness(http, 5.0 if count >= 10_000 else 2.0, svc.root / "peers-jobs-server.log")
        row.update(late_p50_ms=round(_p(late, 50), 1), late_p99_ms=round(_p(late, 99), 1), late_max_ms=round(max(late), 1))
        return row
    finally:
        await http.close()
        server.stop()


async def peer_row(svc, module: str, needs: str, redis: str | None, count: int) -> dict:
    python = str(OBAN_PYTHON) if module.endswith("oban") else sys.executable
    if needs == "redis" and not redis:
        return {"not_run": "redis-server is not installed (make bench installs Debian's, as root)"}
    if module.endswith("oban") and not OBAN_PYTHON.exists():
        return {"not_run": "no .venv-oban (make bench makes it when a python3.12 or newer is on PATH)"}
    env = {**os.environ, "PEER_COUNT": str(count), "PYTHONPATH": str(Path(__file__).parent.parent)}
    if needs == "postgres":
        name = module.rsplit("_", 1)[1]
        svc.pg.drop_database(name)
        env["PEER_DSN"] = svc.pg.create_database(name)
    else:
        env["PEER_REDIS"] = redis
        subprocess.run(["redis-cli", "-u", redis, "flushall"], capture_output=True)
    out = await asyncio.to_thread(subprocess.run, [python, "-m", module], env=env, capture_output=True, text=True,
                                  timeout=1200)
    if out.returncode:
        raise RuntimeError(f"{module} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


async def native_synced(svc, count: int) -> float:
    nats_server = NatsServer(svc.root / "nats-native-synced", sync="always")
    nats_server.start()
    try:
        return await processed_native(nats_server.url, count, "native-synced")
    finally:
        nats_server.stop()


async def run(count: int, size: int) -> Result:
    count = min(count, 10_000)  # 20k processed per peer: procrastinate's ~500/s keeps `make bench` in bounds
    result = Result("peers_jobs")
    with services() as svc, redis_server(svc.root) as redis:
        rows = [("seamq jobs serve (workers over HTTP)", await seamq_row(svc, count)),
                ("seamq jobs serve, nats-server fsync on every write", {
                    "durability": "JetStream file storage, fsync on every write (sync: always)",
                    "processed": round(await processed_synced(svc, count))}),
                (NATIVE, {
                    "processed": round(await processed_native(svc.nats.url, 2 * count, "native"))}),
                ("seamq jobs worker --nats, 64 at once", {
                    "processed": round(await processed_native(svc.nats.url, 2 * count, "native-64", 64))}),
                ("seamq jobs worker --nats, nats-server fsync on every write", {
                    "processed": round(await native_synced(svc, 2 * count))})]
        for name, module, needs in PEERS:
            rows.append((name, await peer_row(svc, module, needs, redis, count)))
    ours = dict(rows)[NATIVE]["processed"]
    for name, row in rows:
        durability = row.pop("durability", "")
        ratio = f"{ours / row['processed']:.2f}" if row.get("processed") else "-"
        result.add(case=name, **row, seamq_processed_vs=ratio)
        if durability:
            result.notes.append(f"{name}: {durability}")
    result.notes.append(f"processed: 2 x {count:,} no-op jobs waiting, from the worker's start to the last run, "
                        f"{WORKERS} at once; late: 300 jobs/s for 5 s (2 s quick), each due 1 s after its enqueue; "
                        "cpu_us_per_job: the peer's own process while processing (seamq's: see the jobs scenario); "
                        f"seamq_processed_vs: {NATIVE}'s rate over the row's")
    return result
