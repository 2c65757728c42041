"""The `seamq` command line: one command group per concept of the spec.

Errors with a code print as `error[CODE]: message` and exit 2 for bad input
(config, topology, events) or 1 for a runtime failure; never a traceback for
something a person can fix.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from seamq.model import ErrorCode, SeamqError
from seamq.settings import Settings, load_settings
from seamq.topology import Topology, load_topology, parse_duration

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    help="seamq: transactional outbox, JetStream relay, inbox consumers and dead letters.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)
db_app = typer.Typer(help="Database schema: versioned migrations shipped in the package.", no_args_is_help=True)
outbox_app = typer.Typer(help="Outbox maintenance: purge published rows.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(outbox_app, name="outbox")

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
    try:
        return asyncio.run(coro)
    except SeamqError as exc:
        err_console.print(f"[red]error[{exc.code.value}][/red]: {exc.message}", highlight=False)
        raise typer.Exit(2 if exc.code in _INPUT_ERRORS else 1) from None


def _settings() -> Settings:
    try:
        return load_settings()
    except SeamqError as exc:
        err_console.print(f"[red]error[{exc.code.value}][/red]: {exc.message}", highlight=False)
        raise typer.Exit(2) from None


def _topology(path: Optional[Path], settings: Settings) -> Topology:
    try:
        return load_topology(path or settings.topology_file, replicas=settings.replicas)
    except SeamqError as exc:
        err_console.print(f"[red]error[{exc.code.value}][/red]: {exc.message}", highlight=False)
        raise typer.Exit(2) from None


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

        nc = await connect(settings.nats, name="seamq-provision")
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
        err_console.print(f"[red]error[INVALID_CONFIG][/red]: --older-than: {exc}")
        raise typer.Exit(2) from None

    async def go():
        from seamq.pg.outbox_repo import PgOutbox
        from seamq.run import pg_pool

        async with pg_pool(_settings().database_dsn()) as pool:
            return await PgOutbox(pool).purge(seconds, batch)

    console.print(f"deleted {_run(go())} published rows older than {older_than}")


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
    exit_when_ready: bool = typer.Option(False, "--exit-when-ready", help="Stop right after 'ready' (smoke tests)."),
) -> None:
    """Run everything locally: embedded nats-server and PostgreSQL, migrations, topology, workers."""
    from seamq.dev.runtime import run_dev

    settings = _settings()
    _run(run_dev(settings, _topology(topology, settings), data_dir or settings.embedded.data_dir,
                 console=console, exit_when_ready=exit_when_ready))


if __name__ == "__main__":  # pragma: no cover
    app()
