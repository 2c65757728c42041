"""What the fault soak (bench.soak) counts once its faults are over: quiet, lost, duplicated, dead-lettered,
out of order, and where the messages of a soak that did not go quiet sit."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import psycopg

from seamq.model import Event
from seamq.nats import jsapi

CONSUMER, STREAM = "sea__from_vibespro", "VIBESPRO_EVENTS"


async def query(dsn: str, sql: str, params=None) -> list[tuple]:
    """One query, waiting out a PostgreSQL restart."""
    async def once() -> list[tuple]:
        async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=2) as conn:
            return await (await conn.execute(sql, params)).fetchall()

    for _ in range(300):
        try:
            return await asyncio.wait_for(once(), 10)
        except (psycopg.Error, asyncio.TimeoutError):
            await asyncio.sleep(0.2)
    raise RuntimeError("PostgreSQL did not come back")


async def quiet(dsn: str, nc, durables: list[str], total: int, timeout: float) -> bool:
    """Every row published, the consumer (each partition) with nothing pending or unacked, twice in a row."""
    deadline, calm = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        [(unpublished,)] = await query(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
        try:
            infos = [await nc.jetstream().consumer_info(STREAM, durable) for durable in durables]
            idle = (all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)
                    and max(i.delivered.stream_seq for i in infos) >= total)
        except Exception:
            idle = False
        calm = calm + 1 if unpublished == 0 and idle else 0
        if calm >= 2:
            return True
        await asyncio.sleep(0.5)
    return False


async def where_they_are(nc, durables: list[str]) -> dict:
    """Each consumer's state at the end: what a soak that did not go quiet left pending, and who held it."""
    out = {}
    for durable in durables:
        try:
            info = await jsapi.call(nc, f"CONSUMER.INFO.{STREAM}.{durable}", timeout=5) or {}
            out[durable] = {"pending": info.get("num_pending"), "ack_pending": info.get("num_ack_pending"),
                            "redelivered": info.get("num_redelivered"), "waiting": info.get("num_waiting"),
                            "delivered": info.get("delivered"), "ack_floor": info.get("ack_floor"),
                            "groups": info.get("priority_groups")}
        except Exception as exc:
            out[durable] = {"error": str(exc)}
    return out


async def read_stream(nc, stream: str) -> list[tuple[str, str | None]]:
    """(Nats-Msg-Id, aggregate id) of every message, in stream order."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    js = nc.jetstream()
    total = (await js.stream_info(stream)).state.messages
    sub = await js.pull_subscribe(">", stream=stream, config=ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=60))
    out: list[tuple[str, str | None]] = []
    deadline = time.monotonic() + 120
    while len(out) < total and time.monotonic() < deadline:
        try:
            for m in await sub.fetch(min(2000, total - len(out)), timeout=2):
                out.append((m.headers.get("Nats-Msg-Id"), m.headers.get("Seamq-Aggregate-Id")))
        except asyncio.TimeoutError:
            pass
    await sub.unsubscribe()
    return out


def violations(sequences: dict[str, list[int]]) -> int:
    """Adjacent inversions: an aggregate's event handled (or stored) before an earlier one."""
    return sum(1 for ns in sequences.values() for a, b in zip(ns, ns[1:]) if b < a)


async def count(dsn: str, nc, events: list[Event]) -> dict:
    kinds = {e.id: e.payload["kind"] for e in events}
    good = {i for i, k in kinds.items() if k != "poison"}
    poison = {i for i, k in kinds.items() if k == "poison"}
    [(unpublished,)] = await query(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
    effects = await query(dsn, "SELECT message_id, aggregate_id, n, pid, attempt, to_char(at, 'HH24:MI:SS.MS') "
                               "FROM soak_effects ORDER BY id")
    dead = {row[0]: row[1] for row in await query(
        dsn, "SELECT message_id, dlq_metadata->>'reason' FROM inbox_messages WHERE consumer = %s "
             "AND status IN ('dead_lettered', 'exhausted')", (CONSUMER,))}
    handled: dict[uuid.UUID, int] = defaultdict(int)
    handling: dict[str, list[int]] = defaultdict(list)
    rows: dict[str, list[tuple]] = defaultdict(list)  # who handled each, when: printed for a violation
    for message_id, aggregate, n, pid, attempt, at in effects:
        handled[message_id] += 1
        handling[aggregate].append(n)
        rows[aggregate].append((n, pid, attempt, at))
    stream = await read_stream(nc, STREAM)
    numbers = {str(e.id): (e.aggregate_id, e.payload["n"]) for e in events}
    seen, stored = set(), defaultdict(list)
    for msg_id, _ in stream:
        if msg_id in seen or msg_id not in numbers:
            continue
        seen.add(msg_id)
        aggregate, n = numbers[msg_id]
        stored[aggregate].append(n)
    result = {
        "written": len(events),
        "unpublished": unpublished,
        "stream_messages": len(stream),
        "stream_duplicates": len(stream) - len({m for m, _ in stream}),
        "missing_from_stream": len(numbers.keys() - seen),
        "handled": len(handled),
        "lost": len(good - handled.keys()),
        "duplicated": sum(c - 1 for c in handled.values() if c > 1),
        "poison": len(poison),
        "poison_dead_lettered": sum(1 for i in poison if dead.get(i) == "handler_rejected"),
        "poison_handled": len(poison & handled.keys()),
        "good_dead_lettered": sum(1 for i in good if i in dead),
        "order_violations_stream": violations(stored),
        "order_violations_handling": violations(handling),
    }
    out_of_order = [a for a, ns in handling.items() if violations({a: ns})][:3]
    if out_of_order:  # each as handled: (n, pid, delivery attempt, time)
        result["out_of_order"] = {a: rows[a] for a in out_of_order}
    never = sorted(numbers[str(i)] for i in good - handled.keys())
    if never:
        result["never_handled"] = never[:20]
    result["ok"] = (result["lost"] == 0 and result["duplicated"] == 0 and result["unpublished"] == 0
                    and result["poison_dead_lettered"] == result["poison"] and result["poison_handled"] == 0
                    and result["good_dead_lettered"] == 0)  # a good event that failed once never reaches the DLQ
    return result
