"""The `seamq` command line: one command group per concept of the spec.

Errors with a code print as `error[CODE]: message` and exit 2 for bad input
(config, topology, events) or 1 for a runtime failure; never a traceback for
something a person can fix.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from seamq.model import ErrorCode, SeamqError
from seamq.settings import Settings, load_settings
from seamq.topology import Topology, load_topology, parse_duration

# Piped output (logs, CI) gets wide tables instead of truncated 80-column ones.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

app = typer.Typer(
    help="seamq: transactional outbox, JetStream relay, inbox consumers and dead letters.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)
db_app = typer.Typer(help="Database schema: versioned migrations shipped in the package.", no_args_is_help=True)
outbox_app = typer.Typer(help="Outbox maintenance: purge published rows.", no_args_is_help=True)
inbox_app = typer.Typer(help="Inbox maintenance: purge processed rows.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(outbox_app, name="outbox")
app.add_typer(inbox_app, name="inbox")

_INPUT_ERRORS = {
    ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_TOPOLOGY, ErrorCode.INVALID_OUTBOX, ErrorCode.FUTURE_EVENT,
    ErrorCode.INVALID_SUBJECT, ErrorCode.DESTRUCTIVE_CHANGE,
}

TopologyOption = typer.Option(None, "--topology", "-t", help="Topology YAML (default: the shipped SDS-047 §10 one).")


@app.callback()
def main(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML settings file (also SEAMQ_CONFIG)."),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="debug, info, warning, error."),
) -> None:
    if config:
        os.environ["SEAMQ_CONFIG"] = str(config)
    from seamq.observability import configure_logging

    configure_logging(log_level or os.environ.get("SEAMQ_LOG_LEVEL", "info"))


def _run(coro):
    """Run a coroutine, turning SeamqError into a clean message and exit code."""
    import psycopg
    from nats.errors import NoServersError

    try:
        return asyncio.run(coro)
    except SeamqError as exc:
        _exit_with(exc)
    except psycopg.OperationalError as exc:
        _exit_with(SeamqError(ErrorCode.DATABASE_UNAVAILABLE, f"{exc} (check SEAMQ_DATABASE_URL)".strip()))
    except (NoServersError, OSError) as exc:
        _exit_with(SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"cannot reach NATS: {exc} (check SEAMQ_NATS__URL)"))


def _exit_with(error: SeamqError):
    err_console.print(f"[red]error[{error.code.value}][/red]: {error.message}", highlight=False)
    raise typer.Exit(2 if error.code in _INPUT_ERRORS else 1)


def _settings() -> Settings:
    try:
        return load_settings()
    except SeamqError as exc:
        _exit_with(exc)


def _topology(path: Optional[Path], settings: Settings) -> Topology:
    try:
        return load_topology(path or settings.topology_file, replicas=settings.replicas)
    except SeamqError as exc:
        _exit_with(exc)


# -- db -----------------------------------------------------------------------

@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply missing migrations (idempotent; safe to run from several processes)."""
    from seamq.pg import migrate

    applied = _run(migrate.upgrade(_settings().database_dsn()))
    if applied:
        for m in applied:
            console.print(f"applied {m.version:04d}_{m.name}")
    else:
        console.print("schema is up to date")


@db_app.command("status")
def db_status() -> None:
    """List migrations and when each was applied."""
    from seamq.pg import migrate

    table = Table("version", "name", "applied at")
    for s in _run(migrate.status(_settings().database_dsn())):
        table.add_row(f"{s.version:04d}", s.name, str(s.applied_at) if s.applied_at else "[yellow]pending[/yellow]")
    console.print(table)


# -- topology -----------------------------------------------------------------

@app.command()
def provision(
    topology: Optional[Path] = TopologyOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff with the server; change nothing."),
    force: bool = typer.Option(False, "--force", help="Allow destructive changes (recreating streams/consumers)."),
) -> None:
    """Create or update streams, DLQ streams and consumers to match the topology."""
    settings = _settings()
    topo = _topology(topology, settings)

    async def go():
        from seamq.nats.connect import connect
        from seamq.nats.provision import apply, plan

        nc = await connect(settings.nats, name="seamq-provision", persistent=False)
        try:
            js = nc.jetstream()
            return await (plan(js, topo) if dry_run else apply(js, topo, force=force))
        finally:
            await nc.close()

    changes = _run(go())
    print_changes(changes, dry_run=dry_run)
    if dry_run and any(c.destructive for c in changes):
        raise typer.Exit(3)


def print_changes(changes, *, dry_run: bool = False) -> None:
    table = Table("kind", "name", "action" if not dry_run else "would", "differences (server -> file)",
                  title="dry run: nothing changed" if dry_run else None)
    colours = {"create": "green", "update": "yellow", "recreate": "red", "unchanged": "dim"}
    for c in changes:
        diffs = "\n".join(f"{f}: {have!r} -> {want!r}" for f, have, want in c.diffs)
        if c.destructive:
            diffs += "\n[red]destructive: " + "; ".join(c.destructive_reasons) + "[/red]"
        table.add_row(c.kind, c.name, f"[{colours[c.action]}]{c.action}[/]", diffs)
    console.print(table)


# -- relay and outbox ---------------------------------------------------------

@app.command()
def relay(topology: Optional[Path] = TopologyOption) -> None:
    """Publish outbox rows to JetStream (CMD-050) until SIGTERM."""
    settings = _settings()
    topo = _topology(topology, settings)

    async def go():
        from seamq.observability import serve_metrics
        from seamq.run import run_relay, stop_on_signals

        serve_metrics(settings.metrics_port)
        stop = asyncio.Event()
        stop_on_signals(stop)
        await run_relay(settings, topo, stop)

    _run(go())


@outbox_app.command("purge")
def outbox_purge(
    older_than: str = typer.Option(..., "--older-than", help="Age of published rows to delete, e.g. 7d."),
    batch: int = typer.Option(5000, help="Rows per DELETE."),
) -> None:
    """Delete published outbox rows older than a window, in bounded batches."""
    try:
        seconds = parse_duration(older_than)
    except ValueError as exc:
        _exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--older-than: {exc}"))

    async def go():
        from seamq.pg.outbox_repo import PgOutbox
        from seamq.run import pg_pool

        async with pg_pool(_settings().database_dsn()) as pool:
            return await PgOutbox(pool).purge(seconds, batch)

    console.print(f"deleted {_run(go())} published rows older than {older_than}")


@app.command()
def consume(
    consumer: str = typer.Option(..., "--consumer", help="A durable consumer of the topology, e.g. sea__from_vibespro."),
    topology: Optional[Path] = TopologyOption,
    handler_url: Optional[str] = typer.Option(None, help="HTTP handler (POST /handle) for every event without a route."),
    registry: Optional[str] = typer.Option(None, help="Registry import path, e.g. myapp.registry:REGISTRY."),
) -> None:
    """Pull from a durable consumer, record in the inbox, dispatch, ACK / redeliver / dead-letter (CMD-051/052)."""
    settings = _settings()
    overrides = {k: v for k, v in dict(handler_url=handler_url, registry=registry).items() if v}
    if overrides:
        settings = settings.model_copy(update={"consumer": settings.consumer.model_copy(update=overrides)})
    topo = _topology(topology, settings)
    if consumer not in topo.consumers:
        _exit_with(SeamqError(ErrorCode.INVALID_TOPOLOGY,
                              f"no consumer {consumer!r}; known: {', '.join(sorted(topo.consumers))}"))

    async def go():
        from seamq.observability import serve_metrics
        from seamq.run import run_consumer, stop_on_signals

        serve_metrics(settings.metrics_port)
        stop = asyncio.Event()
        stop_on_signals(stop)
        await run_consumer(settings, topo, consumer, stop)

    _run(go())


@inbox_app.command("purge")
def inbox_purge(
    older_than: str = typer.Option(..., "--older-than", help="Age of processed rows to delete, e.g. 30d."),
    topology: Optional[Path] = TopologyOption,
    batch: int = typer.Option(5000, help="Rows per DELETE."),
) -> None:
    """Delete processed inbox rows older than a window that still covers every possible redelivery."""
    from seamq.topology import inbox_retention_floor

    settings = _settings()
    topo = _topology(topology, settings)
    try:
        seconds = parse_duration(older_than)
    except ValueError as exc:
        _exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--older-than: {exc}"))
    floor = inbox_retention_floor(topo, nak_max=settings.consumer.nak_max)
    if seconds <= floor:
        _exit_with(SeamqError(ErrorCode.INVALID_CONFIG, (
            f"--older-than {older_than} is too short: a copy of a message may still arrive up to {floor:g}s "
            "(duplicate window + max_deliver x max(ack_wait, NAK delay)) after it was first seen; "
            "purging sooner could process it twice")))

    async def go():
        import psycopg

        from seamq.pg.inbox_repo import purge_inbox

        async with await psycopg.AsyncConnection.connect(settings.database_dsn(), autocommit=True) as conn:
            return await purge_inbox(conn, seconds, batch)

    console.print(f"deleted {_run(go())} processed inbox rows older than {older_than}")


@app.command()
def backlog() -> None:
    """Unpublished outbox rows per context (QRY-050) and unprocessed inbox rows per consumer (QRY-051)."""

    async def go():
        from seamq.pg.outbox_repo import PgOutbox
        from seamq.pg.sql import query
        from seamq.run import pg_pool

        async with pg_pool(_settings().database_dsn()) as pool:
            outbox = await PgOutbox(pool).backlog()
            async with pool.connection() as conn:
                cur = await conn.execute(query("inbox_backlog"))
                inbox = await cur.fetchall()
            return outbox, inbox

    outbox, inbox = _run(go())
    table = Table("outbox context", "unpublished", "failing", "oldest", title="outbox (QRY-050)")
    for row in outbox:
        table.add_row(row["context"], str(row["count"]), str(row["failing"]), str(row["oldest_at"]))
    console.print(table)
    table = Table("inbox consumer", "unprocessed", "oldest", title="inbox (QRY-051)")
    for consumer, count, oldest in inbox:
        table.add_row(consumer, str(count), str(oldest))
    console.print(table)


# -- dev ----------------------------------------------------------------------

@app.command()
def dev(
    data_dir: Optional[Path] = typer.Option(None, help="Where embedded services keep data (default .seamq/)."),
    topology: Optional[Path] = TopologyOption,
    exit_when_ready: bool = typer.Option(False, "--exit-when-ready", help="Stop once provisioned (smoke tests)."),
    demo: bool = typer.Option(True, "--demo/--no-demo", help="Write a demo workload (1% poison)."),
    run_for: Optional[float] = typer.Option(None, "--run-for", help="Stop after this many seconds."),
) -> None:
    """Run everything locally: embedded NATS and PostgreSQL, migrations, topology, relay, consumers, demo."""
    from seamq.dev.runtime import run_dev

    settings = _settings()
    _run(run_dev(settings, _topology(topology, settings), data_dir or settings.embedded.data_dir,
                 console=console, exit_when_ready=exit_when_ready, demo=demo, run_for=run_for))


if __name__ == "__main__":  # pragma: no cover
    app()
