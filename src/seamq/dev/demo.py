"""The demo of `seamq dev`: example handler services, a workload, a dashboard.

Each context gets a FastAPI handler service built with seamq's helper; the
workload writes outbox events in transactions (about 1 in 100 is poison,
so the DLQ has something to show); the dashboard reads the outbox and inbox.
"""

from __future__ import annotations

import asyncio
import random
import time

import psycopg
import uvicorn
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from seamq import outbox
from seamq.embedded import free_port
from seamq.envelope import Envelope, Poison
from seamq.http.server import handler_app
from seamq.model import Event
from seamq.pg.sql import query
from seamq.stopping import sleep_unless_stopped

# What each context emits; the other context consumes it.
DEMO_EVENTS = {"sea": ("order", "order_placed"), "vibespro": ("vibe", "vibe_created")}


async def demo_handler(envelope: Envelope) -> None:
    if envelope.payload.get("poison"):
        raise Poison("demo poison: payload flagged as unprocessable")
    if random.random() < 0.01:
        raise RuntimeError("demo transient failure (will be redelivered)")


class HandlerServices:
    """One uvicorn server per context, in this process."""

    def __init__(self, contexts: list[str], secret: str) -> None:
        self.urls: dict[str, str] = {}
        self.servers = []
        for context in contexts:
            port = free_port()
            config = uvicorn.Config(handler_app(demo_handler, secret=secret), host="127.0.0.1", port=port,
                                    log_level="warning", lifespan="off")
            self.servers.append(uvicorn.Server(config))
            self.urls[context] = f"http://127.0.0.1:{port}/handle"
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.tasks = [asyncio.create_task(server.serve()) for server in self.servers]
        while not all(server.started for server in self.servers):
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        for server in self.servers:
            server.should_exit = True
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def workload(dsn: str, stop: asyncio.Event, rate: float = 50.0, poison_share: float = 0.01) -> None:
    """Commit small transactions of outbox events at about `rate` events/s."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        n = 0
        while not stop.is_set():
            events = []
            for _ in range(5):
                context = random.choice(list(DEMO_EVENTS))
                aggregate_type, event_type = DEMO_EVENTS[context]
                events.append(Event(
                    context=context, aggregate_type=aggregate_type, aggregate_id=f"{aggregate_type}-{n % 50}",
                    event_type=event_type, payload={"n": n, "poison": random.random() < poison_share},
                ))
                n += 1
            async with conn.transaction():
                await outbox.add_many_async(conn, events)
            await sleep_unless_stopped(stop, len(events) / rate)


async def stats(dsn: str) -> tuple[list, list]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        out = await (await conn.execute(query("dashboard_outbox"))).fetchall()
        inbox = await (await conn.execute(query("dashboard_inbox"))).fetchall()
    return out, inbox


def render(out: list, inbox: list, title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)  # fits 80 columns
    table.add_column("", no_wrap=True, min_width=18)
    for column in ("published", "backlog", "handled", "dups", "DLQ", "p50", "p99"):
        table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    for context, published, backlog in out:
        table.add_row(f"outbox {context}", str(published), str(backlog), *[""] * 5)
    ms = lambda v: f"{v * 1000:.1f}" if v is not None else "-"  # noqa: E731
    for consumer, processed, dups, dead, _retrying, p50, p99 in inbox:
        table.add_row(consumer, "", "", str(processed), str(dups), str(dead), ms(p50), ms(p99))
    return table


def _title(started: float) -> str:
    return f"seamq dev, {time.monotonic() - started:.0f}s (p50/p99 ms: outbox commit -> handled, last minute)"


async def dashboard(dsn: str, stop: asyncio.Event, console: Console, interval: float = 1.0) -> None:
    started = time.monotonic()
    if not console.is_terminal:  # logs or CI: a line now and then instead of a live table
        while not stop.is_set():
            await sleep_unless_stopped(stop, 5)
            console.print(render(*await stats(dsn), _title(started)))
        return
    with Live(render([], [], _title(started)), console=console, refresh_per_second=2) as live:
        while not stop.is_set():
            live.update(render(*await stats(dsn), _title(started)))
            await sleep_unless_stopped(stop, interval)
