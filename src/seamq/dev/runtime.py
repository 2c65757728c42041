"""`seamq dev` (`make run`): the whole platform on one machine, no setup by hand.

Starts nats-server and PostgreSQL (unless SEAMQ_NATS__URL / SEAMQ_DATABASE_URL
point elsewhere), applies migrations, provisions the topology, prints what
runs where, says "ready", and runs the workers until Ctrl-C.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from seamq.dev.embedded import NatsServer, PostgresServer, free_port, port_is_free
from seamq.nats.connect import connect
from seamq.nats.provision import apply
from seamq.pg import migrate
from seamq.run import run_relay, stop_on_signals
from seamq.settings import NatsSettings, Settings, redact_url
from seamq.topology import Topology


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def start_embedded(settings: Settings, data_dir: Path, stack: ExitStack) -> Settings:
    """Start what is not configured externally; returns settings pointing at it."""
    update = {}
    if "nats" not in settings.model_fields_set:
        nats = NatsServer(data_dir / "nats", _port(settings.embedded.nats_port), sync=settings.embedded.nats_sync)
        nats.start()
        stack.callback(nats.stop)
        update["nats"] = NatsSettings(url=nats.url)
    if settings.database_url is None:
        pg = PostgresServer(data_dir / "pg", _port(settings.embedded.pg_port))
        pg.start()
        stack.callback(pg.stop)
        update["database_url"] = SecretStr(pg.create_database("seamq"))
    return settings.model_copy(update=update)


async def provision(settings: Settings, topology: Topology):
    nc = await connect(settings.nats, name="seamq-dev", persistent=False)
    try:
        return await apply(nc.jetstream(), topology)
    finally:
        await nc.close()


def describe(console: Console, settings: Settings, topology: Topology, changes) -> None:
    table = Table("service", "where", title="seamq dev")
    table.add_row("nats-server (JetStream)", settings.nats.url)
    table.add_row("PostgreSQL", redact_url(settings.database_dsn()))
    table.add_row("JetStream fsync", settings.embedded.nats_sync)
    console.print(table)
    actions = {(c.kind, c.name): c.action for c in changes}
    streams = Table("stream", "subjects", "storage", "max age", "replicas", "provisioned")
    for s in topology.streams():
        streams.add_row(s.name, ", ".join(s.subjects), s.storage, f"{s.max_age / 86400:g}d", str(s.replicas),
                        actions.get(("stream", s.name), "?"))
    console.print(streams)
    consumers = Table("consumer", "stream", "filter", "ack wait", "max deliver", "max ack pending", "provisioned")
    for c in topology.consumers.values():
        consumers.add_row(c.name, c.stream, c.filter_subject, f"{c.ack_wait:g}s", str(c.max_deliver),
                          str(c.max_ack_pending), actions.get(("consumer", c.name), "?"))
    console.print(consumers)


async def run_dev(
    settings: Settings, topology: Topology, data_dir: Path, *, console: Console, exit_when_ready: bool = False
) -> None:
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        console.print(f"starting embedded services in {data_dir} ...")
        settings = start_embedded(settings, data_dir, stack)
        applied = await migrate.upgrade(settings.database_dsn())
        console.print(f"database: {len(applied)} migration(s) applied, schema up to date")
        changes = await provision(settings, topology)
        describe(console, settings, topology, changes)
        console.print("[bold green]ready[/bold green]: relay running; press Ctrl-C to stop")
        if exit_when_ready:
            return
        stop = asyncio.Event()
        stop_on_signals(stop)
        await run_relay(settings, topology, stop)
        console.print("stopped")
