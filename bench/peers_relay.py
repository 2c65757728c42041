"""Scenario `peers_relay`: seamq's relay next to the Python outbox relays users would install instead,
on the same PostgreSQL, the same JetStream stream and the same payloads, in the same run.

- faststream-outbox 0.19: its relay tutorial's shape (a FastStream NATS publisher stacked on an
  outbox subscriber), JetStream publish acknowledged, the row's Nats-Msg-Id carried over, the row
  deleted after the ack (bench/peers/faststream_outbox_relay.py).
- nats-outbox 0.1: its `nats-outbox relay start` command: Nats-Msg-Id = event id, each publish
  acknowledged, rows marked published in the batch's transaction.

Every relay is measured the same way, from JetStream's side: the backlog rate is N / (stored time
of the last message - of the first), and commit -> published is each message's stored time minus
the writer's clock after its commit returned (the writer uses each library's own producer API).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import nats
import psycopg
from nats.js.api import AckPolicy, ConsumerConfig

from bench.common import (
    SEAMQ, CpuWindow, Result, fresh_database, payload, per_event_us, provision, services, stop, wait_until,
    write_outbox,
)
from bench.e2e import offer, percentile, seamq_writer

STREAM = "SEA_EVENTS"
SUBJECT = "sea.event.order_placed.v1"


@dataclass
class Relay:
    """One relay under test: how to make its table, fill a backlog, start it and write as its users do."""
    name: str
    guarantees: str
    argv: list[str]
    env: dict = field(default_factory=dict)
    kind: str = "seamq"

    def asyncpg_url(self, dsn: str) -> str:
        return dsn.replace("postgresql://", "postgresql+asyncpg://", 1)


async def make_tables(relay: Relay, dsn: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    if relay.kind == "faststream-outbox":
        from bench.peers.faststream_outbox_relay import metadata
    else:
        from nats_outbox.core.models import Base
        metadata = Base.metadata
    engine = create_async_engine(relay.asyncpg_url(dsn))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    await engine.dispose()


def backlog(relay: Relay, dsn: str, count: int, size: int) -> None:
    """`count` rows waiting, written straight into the peer's table (not timed)."""
    if relay.kind == "seamq":
        return write_outbox(dsn, count, size)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        if relay.kind == "faststream-outbox":
            copy = "COPY outbox (queue, payload, headers) FROM STDIN"
            row = lambda n, i: ("events", json.dumps(payload(size, n)).encode(),  # noqa: E731
                                json.dumps({"content-type": "application/json", "correlation_id": i, "Nats-Msg-Id": i}))
        else:
            copy = ("COPY outbox_events (event_id, subject, headers, payload, status, retry_count, aggregate_id) "
                    "FROM STDIN")
            row = lambda n, i: (i, SUBJECT, json.dumps({"Nats-Msg-Id": i}), json.dumps(payload(size, n)),  # noqa: E731
                                "pending", 0, f"o-{n % 1000}")
        with cur.copy(copy) as out:
            for n in range(count):
                out.write_row(row(n, str(uuid.uuid4())))
        conn.commit()


def writer(relay: Relay, dsn: str, size: int):
    """The peer's own producer API, one transaction per call, for the offered-load run."""
    if relay.kind == "seamq":
        return seamq_writer(dsn, size, context="sea")
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    @asynccontextmanager
    async def connect():
        engine = create_async_engine(relay.asyncpg_url(dsn), pool_size=1)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        if relay.kind == "faststream-outbox":
            from bench.peers.faststream_outbox_relay import table
            from faststream_outbox import OutboxBroker
            broker = OutboxBroker(engine, outbox_table=table, logger=None)

            async def write(count: int, first: int) -> list[str]:
                ids = [str(uuid.uuid4()) for _ in range(count)]
                async with sessions() as session, session.begin():
                    for n, i in enumerate(ids):
                        await broker.publish(payload(size, first + n), queue="events", session=session,
                                             headers={"Nats-Msg-Id": i})
                return ids
        else:
            from nats_outbox.core.outbox import outbox_transaction

            async def write(count: int, first: int) -> list[str]:
                async with sessions() as session, outbox_transaction(session) as tx:
                    ids = [str(tx.publish_event(SUBJECT, payload(size, first + n), aggregate_type="order",
                                                aggregate_id=f"o-{(first + n) % 500}")) for n in range(count)]
                return ids
        try:
            yield write
        finally:
            await engine.dispose()

    return connect


async def stream_state(nats_url: str) -> tuple[int, int, int]:
    nc = await nats.connect(nats_url)
    try:
        state = (await nc.jetstream().stream_info(STREAM)).state
        return state.messages, state.first_seq, state.last_seq
    finally:
        await nc.close()


async def stored_rate(nats_url: str) -> float:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    state = (await js.stream_info(STREAM)).state
    first, last = await js.get_msg(STREAM, state.first_seq), await js.get_msg(STREAM, state.last_seq)
    await nc.close()
    return state.messages / (last.time - first.time).total_seconds()


async def stored_times(nats_url: str) -> dict[str, float]:
    """Each message's Nats-Msg-Id -> the time JetStream stored it."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(">", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    times: dict[str, float] = {}
    try:
        while True:
            try:
                batch = await sub.fetch(1000, timeout=1.0)
            except asyncio.TimeoutError:  # nats-py raises its own subclass, or this one itself when busy
                return times
            for msg in batch:
                times[msg.headers["Nats-Msg-Id"]] = msg.metadata.timestamp.timestamp()
    finally:
        await sub.unsubscribe()
        await nc.close()


async def reset(svc, relay: Relay, name: str) -> str:
    nc = await nats.connect(svc.nats.url)
    await nc.jetstream().purge_stream(STREAM)
    await nc.close()
    if relay.kind == "seamq":
        return await fresh_database(svc, name)
    svc.pg.drop_database(name)
    dsn = svc.pg.create_database(name)  # the peer's own tables only
    await make_tables(relay, dsn)
    return dsn


def start(svc, relay: Relay, dsn: str):
    env = svc.env(PEER_DSN=relay.asyncpg_url(dsn), PEER_NATS=svc.nats.url, OUTBOX_DATABASE_URL=relay.asyncpg_url(dsn),
                  OUTBOX_NATS_URL=svc.nats.url, **relay.env)
    log = svc.root / f"{relay.kind}.log"
    return subprocess.Popen(relay.argv, env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def alive(proc, svc, relay: Relay) -> None:
    if proc.poll() is not None:
        tail = (svc.root / f"{relay.kind}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{relay.name} exited with {proc.returncode}: {tail}")


async def drain(svc, relay: Relay, count: int, size: int) -> dict:
    dsn = await reset(svc, relay, "peers_backlog")
    await asyncio.to_thread(backlog, relay, dsn, count, size)
    proc = start(svc, relay, dsn)
    try:
        cpu = CpuWindow(relay=(proc.pid,), pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,))
        stored = lambda: stream_state(svc.nats.url)  # noqa: E731
        check = lambda: alive(proc, svc, relay)  # noqa: E731
        await wait_until(lambda: _count(stored, lambda n: n > 0, check), timeout=120, interval=0.01)
        cpu.start()
        first = (await stored())[0]
        await wait_until(lambda: _count(stored, lambda n: n >= count, check), timeout=1800, interval=0.2)
        used = per_event_us(cpu.end(), count - first)
    finally:
        rss = stop(proc)
    return dict(events_per_s=round(await stored_rate(svc.nats.url)), peak_rss_mb=round(rss), **used)


async def _count(stored, test, check=None) -> bool:
    if check:
        check()
    return test((await stored())[0])


async def latency(svc, relay: Relay, rate: int, seconds: float, size: int) -> dict:
    dsn = await reset(svc, relay, "peers_latency")
    proc = start(svc, relay, dsn)
    try:
        await asyncio.sleep(3.0)  # connected and idle
        commits, achieved = await offer(dsn, rate, seconds, size, writer=writer(relay, dsn, size))
        try:
            await wait_until(lambda: _count(lambda: stream_state(svc.nats.url), lambda n: n >= len(commits)),
                             timeout=120, interval=0.2)
        except TimeoutError:
            pass  # a relay that fell behind: its published share is reported
    finally:
        stop(proc)
    times = await stored_times(svc.nats.url)
    ms = sorted((times[i] - t) * 1000 for i, t in commits.items() if i in times)
    return dict(achieved_per_s=round(achieved), published=f"{len(ms)}/{len(commits)}",
                p50_ms=round(statistics.median(ms), 1), p99_ms=round(percentile(ms, 0.99), 1), max_ms=round(ms[-1], 1))


RELAYS = [
    Relay("seamq relay x1", "per-aggregate order; Nats-Msg-Id; crash-safe (row marked after the ack)",
          [*SEAMQ, "relay"], {"SEAMQ_RELAY__BATCH_SIZE": "500"}),
    Relay("faststream-outbox 0.19 (16 workers)", "no order (16 workers, SKIP LOCKED); Nats-Msg-Id set by the "
          "writer; crash-safe (row deleted after the ack)", [sys.executable, "-m", "bench.peers.faststream_outbox_relay"],
          {"PEER_WORKERS": "16"}, kind="faststream-outbox"),
    Relay("faststream-outbox 0.19 (1 worker)", "insertion order (one worker); otherwise as above",
          [sys.executable, "-m", "bench.peers.faststream_outbox_relay"], {"PEER_WORKERS": "1"}, kind="faststream-outbox"),
    Relay("nats-outbox 0.1 (batch 1000, poll 0.05 s)", "insertion order with one relay; Nats-Msg-Id; crash-safe "
          "(rows marked in the batch's transaction after each ack)",
          [sys.executable, "-c", "from nats_outbox.cli import app; app()", "relay", "start", "--log-level", "WARNING"],
          {"OUTBOX_BATCH_SIZE": "1000", "OUTBOX_POLLING_INTERVAL": "0.05"}, kind="nats-outbox"),
]


async def run(count: int, size: int) -> list[Result]:
    quick = count < 10_000
    backlog_result, latency_result = Result("peers_relay"), Result("peers_relay_latency")
    seconds = 2.0 if quick else 8.0
    with services() as svc:
        await provision(svc.nats.url)
        for relay in RELAYS:
            started = time.monotonic()
            row = await drain(svc, relay, count, size)
            backlog_result.add(case=relay.name, **row, seconds=round(time.monotonic() - started))
            latency_result.add(case=relay.name, offered_per_s=2000, **await latency(svc, relay, 2000, seconds, size))
    ours = backlog_result.rows[0]["events_per_s"]
    best = max(row["events_per_s"] for row in backlog_result.rows[1:])
    for row in backlog_result.rows:
        row["vs_best_peer"] = round(row["events_per_s"] / best, 2)
    backlog_result.notes += [
        f"seamq relay x1 / the fastest peer: {ours / best:.1f}x",
        *[f"{relay.name}: {relay.guarantees}" for relay in RELAYS],
        "rate = N / (JetStream's stored time of the last message - of the first); cpu_us_* from the first message "
        "stored to the N-th: the relay process, PostgreSQL (all its processes), nats-server"]
    latency_result.notes.append("open loop at 2k events/s, each library's own producer API; latency = JetStream's "
                                "stored time - the writer's clock after its commit")
    return [backlog_result, latency_result]
