"""Fault-injection soak (`make soak`): zero loss and exactly-once, counted after real faults.

Events are written through the public outbox API (one writer, transactions of
100, over many aggregates, each aggregate's events numbered in write order)
while 2 relays and 2 consumers run as processes with an in-process handler
that writes one side-effect row per success in the inbox transaction. 1% of
events fail on their first delivery, 0.1% are poison. Meanwhile a random
worker is killed -9 (and restarted) every few seconds, nats-server is killed
-9 and restarted, and PostgreSQL is shut down `immediate` (no checkpoint:
crash recovery) and restarted; and the tables' days change under the workers:
old ones dropped, and the day the second half of the events is dated in made,
which moves those rows out of the default partition (`Days`). Once everything is quiet it counts: lost,
duplicated, poison dead-lettered, unpublished, order violations in the stream
and in handling order, time to quiet. It prints a table, writes JSON, and
exits 1 on any loss, duplicate, unpublished row or poison not dead-lettered.

    python -m bench.soak                     # 100,000 events, 1,000 aggregates (docs/benchmarks.md)
    python -m bench.soak --events 3000 --aggregates 100 --fault-seconds 8   # what the tests run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from bench.common import SEAMQ, fresh_database, services, uuid7_at
from bench.soak_count import CONSUMER, count, query, quiet, where_they_are
from seamq import outbox
from seamq.ids import uuid7
from seamq.model import Event
from seamq.pg import partitions
from seamq.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
MIN_KILLS = 2  # workers killed -9 in every soak, however short its fault window
TOPOLOGY = """
contexts:
  sea: {{stream: {{duplicate_window: 5m}}}}
  vibespro: {{stream: {{duplicate_window: 5m}}}}
consumers:
  sea__from_vibespro: {{ack_wait: 5s, max_deliver: 20, max_ack_pending: 1000{partitioned}}}
  vibespro__from_sea: {{ack_wait: 5s, max_deliver: 20, max_ack_pending: 1000}}
"""


def kind(i: int) -> str:
    if i % 1000 == 7:
        return "poison"  # 0.1%
    if i % 100 == 3:
        return "flaky"  # 1%: fails on its first delivery
    return "ok"


class Workers:
    """2 relays and 2 consumers as processes; any of them can be killed -9 and restarted."""

    def __init__(self, env: dict, logs: Path) -> None:
        consume = ["consume", "--consumer", CONSUMER]
        self.argvs = {"relay-1": ["relay"], "relay-2": ["relay"], "consumer-1": consume, "consumer-2": consume}
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.kills = 0
        self.exits = 0  # exited by themselves (at start, the database away) and started again

    def start(self, name: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([*SEAMQ, *self.argvs[name]], env=self.env, cwd=ROOT,
                                                stdout=log, stderr=subprocess.STDOUT)

    def start_all(self) -> None:
        for name in self.argvs:
            self.start(name)

    def kill_one(self) -> str:
        name = random.choice(sorted(self.procs))
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        self.kills += 1
        self.start(name)
        return name

    async def supervise(self) -> None:
        """What a supervisor (systemd Restart=always, Kubernetes) does: a worker that exits by itself is
        started again. A worker that starts while PostgreSQL is still recovering exits at once, with a
        coded error, for exactly this (on a busy machine the faults can land before the workers are up)."""
        while True:
            await asyncio.sleep(0.2)
            for name, proc in list(self.procs.items()):
                if proc.poll() is not None:
                    self.exits += 1
                    self.start(name)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Days:
    """A day made and days dropped while the soak runs (issue 45). The second half of the events is
    dated a few days ahead, beyond the days the workers make, so it waits in the default partition
    until that day is made, which moves it there under the relays and consumers; a day of history,
    long past its retention, is dropped with its neighbours under them too."""

    AHEAD, PAST, RETENTION, HISTORY = timedelta(days=5), timedelta(days=10), timedelta(days=7), 10_000

    def __init__(self, dsn: str) -> None:
        self.dsn, self.now = dsn, datetime.now(timezone.utc)
        self.later_ms = int((self.now + self.AHEAD).timestamp() * 1000)
        self.made: list[str] = []
        self.dropped: list[str] = []

    async def prepare(self) -> None:
        """Days from 10 days ago (as days passing would have made them), one of them with history."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for table in ("outbox_events", "inbox_messages", "inbox_attempts"):
                for day in await partitions.dated(conn, table):
                    await conn.execute(f"DROP TABLE {day.name}")
            await partitions.make_ahead(conn, self.now - self.PAST)
            await partitions.make_ahead(conn, self.now)
            ms = int((self.now - self.PAST).timestamp() * 1000)
            ident = uuid7_at("%(ms)s + g")
            await conn.execute(
                "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                "published_at, publish_attempts, part) SELECT x.id, 'vibespro', 'order', 'history', 'vibe_created', "
                f"'{{}}', now() - interval '10 days', 1, seamq_id_time(x.id) FROM (SELECT {ident} AS id "
                "FROM generate_series(1, %(rows)s) g) x", dict(ms=ms, rows=self.HISTORY))
            await conn.execute(
                "INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, received_at, "
                "attempts, status, processed_at, part) SELECT %(consumer)s, x.id, 'vibespro.event.vibe_created.v1', "
                "'vibe_created', 1, now() - interval '10 days', 1, 'processed', now() - interval '10 days', "
                f"seamq_id_time(x.id) FROM (SELECT {ident} AS id FROM generate_series(1, %(rows)s) g) x",
                dict(ms=ms, rows=self.HISTORY, consumer=CONSUMER))

    async def make(self) -> str:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
            self.made = [day.name for day in await partitions.make_ahead(conn, self.now + self.AHEAD)]
        return f"{len(self.made)} days made under the workers, the last {self.made[-1:]}"

    async def drop(self) -> str:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
            self.dropped = [d.partition.name for table in ("outbox_events", "inbox_messages")
                            for d in await partitions.drop_expired(conn, table, self.RETENTION)]
        return f"{len(self.dropped)} days dropped under the workers, the first {self.dropped[:1]}"

    async def count(self) -> dict:
        [(left,)] = await query(self.dsn, "SELECT count(*) FROM outbox_events_default")
        [(history,)] = await query(self.dsn, "SELECT count(*) FROM outbox_events WHERE aggregate_id = 'history'")
        return dict(days_made=len(self.made), days_dropped=len(self.dropped), rows_left_in_default=left,
                    history_rows_left=history)


async def write(dsn: str, events: list[Event], progress: list[int], stalls: list[int]) -> None:
    """Through the public API, 100 per transaction, riding out PostgreSQL restarts. A commit
    whose outcome is unknown (the server died during it) is checked before it is retried.
    A transaction that hangs (seen once: a connection left waiting by the immediate shutdown)
    counts as failed after 10 s."""
    conn = None

    async def transaction() -> None:
        async with conn.transaction():
            await outbox.add_many_async(conn, chunk)

    for start in range(0, len(events), 100):
        chunk = events[start:start + 100]
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(dsn, connect_timeout=2), 10)
                await asyncio.wait_for(transaction(), 10)
                break
            except (psycopg.Error, asyncio.TimeoutError) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    stalls[0] += 1
                    conn = None
                await asyncio.sleep(0.2)
                try:
                    if conn is not None and not conn.closed:
                        await asyncio.wait_for(conn.close(), 5)
                    conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(dsn, connect_timeout=2), 10)
                    [(committed,)] = await query(dsn, "SELECT count(*) FROM outbox_events WHERE id = %s",
                                                 (chunk[0].id,))
                    if committed:
                        break  # it had committed
                except (psycopg.Error, asyncio.TimeoutError):
                    conn = None
        progress[0] = start + len(chunk)
    if conn is not None:
        await conn.close()


async def soak(events_total: int, aggregates: int, kill_every: float, fault_seconds: float,
               quiet_timeout: float, partitions: int = 0, nats_down: float = 10.0) -> dict:
    import nats

    from seamq.nats.provision import apply

    report: dict = {"events": events_total, "aggregates": aggregates, "partitions": partitions, "faults": []}
    with services() as svc:
        dsn = await fresh_database(svc, "soak")
        topology_file = svc.root / "topology.yaml"
        topology_file.write_text(TOPOLOGY.format(
            partitioned=f", partitions: {partitions}, pinned_ttl: 3s" if partitions else ""))
        durables = load_topology(topology_file).consumer(CONSUMER).durables()
        async def quietly(exc):  # the driver rides out the nats-server restart; no traceback per attempt
            pass

        nc = await nats.connect(svc.nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                                error_cb=quietly)
        await apply(nc.jetstream(), load_topology(topology_file))
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("CREATE TABLE soak_effects (id bigserial PRIMARY KEY, message_id uuid, "
                               "aggregate_id text, n int, pid int, attempt int, at timestamptz DEFAULT clock_timestamp())")
            await conn.commit()
        env = svc.env(SEAMQ_TOPOLOGY_FILE=str(topology_file), SEAMQ_CONSUMER__REGISTRY="bench.soak_handlers:REGISTRY",
                      SEAMQ_CONSUMER__NAK_BASE="0.2", SEAMQ_CONSUMER__NAK_MAX="2", PYTHONPATH=str(ROOT),
                      SEAMQ_LOG_LEVEL="info")  # a failed soak shows each partition's handovers
        logs = svc.root / "logs"
        logs.mkdir()
        days = Days(dsn)
        await days.prepare()
        events = [Event(context="vibespro", aggregate_type="order", aggregate_id=f"a-{i % aggregates}",
                        event_type="vibe_created", payload={"n": i // aggregates, "kind": kind(i)},
                        **({"id": uuid7(days.later_ms + i)} if i >= events_total // 2 else {}))
                  for i in range(events_total)]
        workers = Workers(env, logs)
        workers.start_all()
        supervisor = asyncio.create_task(workers.supervise())
        started = time.monotonic()
        progress, stalls = [0], [0]
        writer = asyncio.create_task(write(dsn, events, progress, stalls))

        def fault(what: str) -> None:
            report["faults"].append({"at_s": round(time.monotonic() - started, 1), "fault": what,
                                     "written": progress[0]})
            print(f"  {time.monotonic() - started:6.1f}s  {what}", flush=True)

        try:
            nats_done = pg_done = False
            nats_back = None
            next_kill = started + kill_every
            # Until the events are written, the fault window is over, nats-server is back and at least
            # two workers were killed (the restarts alone can outlast the window on a busy machine).
            while (not writer.done() or time.monotonic() - started < fault_seconds or nats_back is not None
                   or workers.kills < MIN_KILLS or not days.made or not days.dropped):
                await asyncio.sleep(0.1)
                now, share = time.monotonic(), progress[0] / events_total
                for done, at, change in ((days.dropped, 0.45, days.drop), (days.made, 0.75, days.make)):
                    if not done and (share >= at or now - started > fault_seconds * at):
                        try:  # PostgreSQL may be down, or a lock not had in time: again, 0.1 s later
                            fault(await change())
                        except psycopg.Error:
                            pass
                if now >= next_kill:
                    fault(f"kill -9 {workers.kill_one()}")
                    next_kill = now + kill_every * random.uniform(0.5, 1.5)
                if not nats_done and (share >= 0.3 or now - started > fault_seconds * 0.3):
                    nats_done = True
                    svc.nats.kill()
                    fault("kill -9 nats-server")
                    nats_back = now + nats_down  # kills go on meanwhile
                if nats_back is not None and now >= nats_back:
                    nats_back = None
                    svc.nats.start()
                    fault("nats-server restarted")
                if not pg_done and (share >= 0.6 or now - started > fault_seconds * 0.6):
                    pg_done = True
                    svc.pg.proc.send_signal(signal.SIGQUIT)  # pg_ctl stop -m immediate
                    svc.pg.proc.wait()
                    fault("PostgreSQL stopped -m immediate")
                    await asyncio.sleep(1)
                    svc.pg.start()
                    fault("PostgreSQL restarted (crash recovery)")
            await writer
            written_at = time.monotonic()
            report["write_seconds"] = round(written_at - started, 1)
            report["writer_stalls"] = stalls[0]
            calm = await quiet(dsn, nc, durables, events_total, quiet_timeout)
            report["quiet"] = calm
            report["time_to_quiet_s"] = round(time.monotonic() - written_at, 1) if calm else None
        finally:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
            workers.stop_all()
        report["worker_kills"] = workers.kills
        report["worker_exits_restarted"] = workers.exits
        report.update(await count(dsn, nc, events))
        report.update(await days.count())
        report["ok"] = report["ok"] and report["rows_left_in_default"] == 0 == report["history_rows_left"]
        if not report["ok"]:
            report["consumers"] = await where_they_are(nc, durables)
        if partitions:  # the claim partitions make: each aggregate handled in order, whatever the faults
            report["ok"] = report["ok"] and report["order_violations_handling"] == 0
        await nc.close()
        if not report["ok"]:
            for log in sorted(logs.iterdir()):
                lines = [line for line in log.read_text(errors="replace").splitlines() if any(
                    word in line for word in ("partition", "started", "stopped", "error", "Traceback"))]
                print(f"--- {log.name} (its partition and start lines, the last 25)\n" + "\n".join(lines[-25:]))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--aggregates", type=int, default=1000)
    parser.add_argument("--kill-every", type=float, default=4.0, help="seconds between worker kills (+-50%%)")
    parser.add_argument("--fault-seconds", type=float, default=30.0, help="inject faults at least this long")
    parser.add_argument("--quiet-timeout", type=float, default=600.0)
    parser.add_argument("--nats-down", type=float, default=10.0, help="seconds nats-server stays down")
    parser.add_argument("--partitions", type=int, default=0,
                        help="partition the consumer (order across processes; 0: one shared consumer)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    print(f"soak: {args.events:,} events over {args.aggregates:,} aggregates, 2 relays, 2 consumers; faults:",
          flush=True)
    report = asyncio.run(soak(args.events, args.aggregates, args.kill_every, args.fault_seconds,
                              args.quiet_timeout, args.partitions, args.nats_down))
    report["finished_at"] = datetime.now(timezone.utc).isoformat()
    width = max(map(len, report))
    for key, value in report.items():
        if key != "faults":
            print(f"{key:<{width}}  {value}")
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, default=str)
    (args.out / f"soak-{int(time.time())}.json").write_text(text)
    (args.out / "soak-latest.json").write_text(text)
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
