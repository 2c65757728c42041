"""Shared bench plumbing: embedded services, payloads, process RSS, result tables."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from seamq import outbox
from seamq.embedded import NatsServer, PostgresServer, running
from seamq.model import Event
from seamq.nats.provision import apply
from seamq.pg import migrate
from seamq.topology import load_topology

SEAMQ = [sys.executable, "-m", "seamq"]


def payload(size: int, n: int) -> dict:
    """A JSON object of about `size` bytes once serialised."""
    base = {"n": n, "kind": "bench"}
    pad = max(0, size - len(json.dumps(base)) - 10)
    return {**base, "pad": "x" * pad}


@dataclass
class Services:
    root: Path
    nats: NatsServer
    pg: PostgresServer
    dsn: str = ""

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        env.update(SEAMQ_DATABASE_URL=self.dsn, SEAMQ_NATS__URL=self.nats.url, SEAMQ_LOG_LEVEL="warning")
        env.update({k: str(v) for k, v in extra.items()})
        return env


@contextmanager
def services(nats_sync: str = "default"):
    """Fresh nats-server and PostgreSQL (durable settings, as in production) in a temp dir."""
    root = Path(tempfile.mkdtemp(prefix="seamq-bench-"))
    nats = NatsServer(root / "nats", sync=nats_sync)
    pg = PostgresServer(root / "pg", durable=True)
    try:
        with running(nats, pg):  # everything started is stopped, also when a later start fails
            yield Services(root, nats, pg)
    finally:
        pg.remove_data()
        shutil.rmtree(root, ignore_errors=True)


async def fresh_database(svc: Services, name: str) -> str:
    svc.pg.drop_database(name)
    svc.dsn = svc.pg.create_database(name)
    await migrate.upgrade(svc.dsn)
    return svc.dsn


async def provision(nats_url: str, topology=None):
    import nats

    topology = topology or load_topology()
    nc = await nats.connect(nats_url)
    await apply(nc.jetstream(), topology)
    await nc.close()
    return topology


def uuid7_at(ms: str, g: str = "g") -> str:
    """SQL for a UUIDv7 id dated at the millisecond `ms` (an SQL expression), its other bits drawn
    from `g`: how the benches and tests write a history dated where they want it."""
    return (f"CAST(lpad(to_hex({ms}), 12, '0') || '7' || substr(md5({g}::text), 1, 3) || '8' || "
            f"substr(md5({g}::text), 4, 15) AS uuid)")


def write_outbox(dsn: str, count: int, size: int, context: str = "sea", aggregates: int = 1000) -> None:
    with psycopg.connect(dsn) as conn:
        for start in range(0, count, 5000):
            with conn.transaction():
                outbox.add_many(conn, [
                    Event(context=context, aggregate_type="order", aggregate_id=f"o-{n % aggregates}",
                          event_type="order_placed", payload=payload(size, n))
                    for n in range(start, min(count, start + 5000))
                ])


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set, read before it exits."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # from field 3 (state) on


def cpu_seconds(pid: int, children: bool = False) -> float:
    """A process's user + system CPU so far. With `children`, also its children's, reaped and
    live: PostgreSQL's backends are the postmaster's children."""
    try:
        fields = _stat(pid)
    except OSError:
        return float("nan")
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    child = _stat(int(entry.name))
                except OSError:
                    continue
                if int(child[1]) == pid:
                    ticks += sum(int(child[i]) for i in (11, 12, 13, 14))
    return ticks / _TICK


class CpuWindow:
    """CPU seconds of each process between `start` and `end`, from /proc."""

    def __init__(self, **pids: tuple[int, ...]) -> None:
        self.pids = pids

    def _read(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(pid, children=(name == "pg")) for pid in pids)
                for name, pids in self.pids.items()}

    def start(self) -> None:
        self.before = self._read()

    def end(self) -> dict[str, float]:
        after = self._read()
        return {name: after[name] - self.before[name] for name in after}


def per_event_us(cpu: dict[str, float], events: int) -> dict[str, float]:
    return {f"cpu_us_{name}": round(seconds / events * 1e6, 1) for name, seconds in cpu.items()}


async def cpu_per_row(cpu: CpuWindow, done: Callable[[], int], total: int, timeout: float) -> dict[str, float]:
    """CPU per row of each process from the first row `done()` counts to the `total`-th:
    process start excluded."""
    await wait_until(lambda: done() > 0, timeout=timeout, interval=0.01)  # a busy machine starts slowly
    cpu.start()
    first = done()
    await wait_until(lambda: done() >= total, timeout=timeout, interval=0.2)
    return per_event_us(cpu.end(), total - first)


def self_peak_rss_mb() -> float:
    return peak_rss_mb(os.getpid())


def spawn(argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> float:
    """SIGTERM a worker; returns its peak RSS in MB."""
    rss = peak_rss_mb(proc.pid)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    return rss


async def wait_until(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError("benchmark step did not finish in time")


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform()}


@dataclass
class Result:
    scenario: str
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append(row)


BENCH_TOPOLOGY = """
# Bench topology: SDS-047 §10 streams; the consumer may hold more unacked
# messages than the spec's 50, since batches of 500 are what throughput needs.
contexts:
  sea: {}
  vibespro: {}
consumers:
  sea__from_vibespro: {ack_wait: 120s, max_deliver: 20, max_ack_pending: %d}
  vibespro__from_sea: {ack_wait: 120s, max_deliver: 20, max_ack_pending: %d}
"""


def bench_topology(root: Path, max_ack_pending: int = 1000) -> Path:
    path = root / "topology.yaml"
    path.write_text(BENCH_TOPOLOGY % (max_ack_pending, max_ack_pending))
    return path


async def relay_and_consumer(svc: Services, database: str, **env) -> tuple[str, subprocess.Popen, subprocess.Popen]:
    """A migrated database, the bench topology provisioned, one relay and one consumer process (in-process
    no-op handler, bench.handlers) connected and idle: (dsn, relay, consumer); end them with `stop`."""
    topology_file = bench_topology(svc.root)
    await provision(svc.nats.url, load_topology(topology_file))
    dsn = await fresh_database(svc, database)
    env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                  PYTHONPATH=os.getcwd(), **env)
    relay = spawn([*SEAMQ, "relay"], env)
    consumer = spawn([*SEAMQ, "consume", "--consumer", "sea__from_vibespro"], env)
    await asyncio.sleep(2.0)
    return dsn, relay, consumer


async def publish_events(nats_url: str, count: int, size: int, context: str = "vibespro") -> None:
    """Publish `count` well-formed events straight into the context's stream (no outbox),
    with the headers the relay would send (the traceparent included)."""
    import nats as nats_client

    from seamq.model import message_headers, traceparent_for
    from seamq.nats.publisher import OutMessage, PipelinedPublisher

    nc = await nats_client.connect(nats_url)
    publisher = await PipelinedPublisher(nc, timeout=30).start()
    for start in range(0, count, 2000):
        events = [Event(context=context, aggregate_type="vibe", aggregate_id=f"v-{n % 1000}",
                        event_type="vibe_created", payload=payload(size, n))
                  for n in range(start, min(count, start + 2000))]
        results = await publisher.publish_many([
            OutMessage(str(e.subject), json.dumps(e.payload).encode(), message_headers(e, traceparent_for(e.id))) for e in events])
        assert all(r.ok for r in results), "bench publish failed"
    await nc.close()


def serve_http_app(port: int) -> subprocess.Popen:
    """uvicorn with bench.http_app on 127.0.0.1:port, one worker."""
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.http_app:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning", "--no-access-log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("uvicorn did not start")


def histogram_quantiles(metrics_text: str, name: str, quantiles=(0.5, 0.99)) -> dict[float, float]:
    """Quantiles of a Prometheus histogram from its exposition text (linear within buckets)."""
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    out = {}
    for q in quantiles:
        target, previous_le, previous_count = q * total, 0.0, 0.0
        for le, count in buckets:
            if count >= target:
                span = count - previous_count
                fraction = (target - previous_count) / span if span else 0
                out[q] = previous_le + (le - previous_le) * fraction if le != float("inf") else previous_le
                break
            previous_le, previous_count = le, count
    return out
