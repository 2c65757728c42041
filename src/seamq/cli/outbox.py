"""`seamq outbox`: purge published rows; see, move, retry or drop the rows the relay parked.

A parked row is one the relay can never publish as it is (its context has no stream, its subject
is invalid, it is larger than the server takes): set aside, counted in seamq_outbox_parked, and
left to a person, who knows whether `shopp` was a typo (`move`), a context the relay's topology
lacked (`retry` once it has it), or an event to let go (`drop`).
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, console, duration, exit_with, print_json, run, settings
from seamq.model import ErrorCode, SeamqError, validate_token

app = typer.Typer(help="The outbox: purge published rows; list, move, retry or drop parked ones.",
                  no_args_is_help=True)

Id = typer.Argument(None, help="One parked row's id; or use --context.")
Context = typer.Option(None, "--context", help="Every parked row of this context.")


@app.command("purge")
def outbox_purge(
    older_than: str = typer.Option(..., "--older-than", help="Age of published rows to delete, e.g. 7d."),
    batch: int = typer.Option(5000, help="Rows per DELETE."),
) -> None:
    """Published outbox rows older than a window: whole partitions dropped, other rows deleted in batches."""
    seconds = duration("--older-than", older_than)

    async def go():
        from seamq.pg.outbox_repo import PgOutbox  # the database driver loads with the command that needs it
        from seamq.wiring import pg_pool

        async with pg_pool(settings().database_dsn(), one_shot=True) as pool:
            return await PgOutbox(pool).purge(seconds, batch)

    console.print(f"published rows older than {older_than}: {run(go()).rows}")


@app.command()
def parked(context: Optional[str] = Context, limit: int = typer.Option(1000, "--limit"),
           as_json: bool = JsonOption) -> None:
    """Rows the relay can never publish as they are, oldest first, with why."""
    rows = _alone("parked", context, None, limit)
    if as_json:
        return print_json(rows)
    table = Table("id", "context", "event", "aggregate", "why", "parked at", title=f"{len(rows)} parked rows")
    for row in rows:
        table.add_row(str(row["id"]), row["context"], f"{row['event_type']}.v{row['event_version']}",
                      f"{row['aggregate_type']}/{row['aggregate_id']}", row["parked_reason"],
                      str(row["parked_at"])[:19])
    console.print(table)


@app.command()
def move(context: str = typer.Option(..., "--context", help="The parked rows' context (e.g. a typo)."),
         to: str = typer.Option(..., "--to", help="The context they belong to.")) -> None:
    """Give parked rows of a context another context, and hand them back to the relay."""
    try:
        validate_token(to, "context")
    except SeamqError as exc:
        exit_with(exc)
    moved = _alone("unpark", context, None, to)
    console.print(f"moved {moved} parked rows from {context} to {to}")


@app.command()
def retry(row_id: Optional[str] = Id, context: Optional[str] = Context) -> None:
    """Hand parked rows back to the relay as they are (after its topology gained their context)."""
    row = _id(row_id, context)
    console.print(f"handed {_alone('unpark', context, row)} parked rows back to the relay")


@app.command()
def drop(row_id: Optional[str] = Id, context: Optional[str] = Context,
         yes: bool = typer.Option(False, "--yes", help="Really delete them: these events will never be sent.")) -> None:
    """Delete parked rows: their events are never published."""
    row = _id(row_id, context)
    if not yes:
        count = len(_alone("parked", context, row, 100_000))
        exit_with(SeamqError(ErrorCode.CONFIRMATION_NEEDED, f"{count} parked rows selected; add --yes to delete them"))
    console.print(f"dropped {_alone('drop_parked', context, row)} parked rows")


def _id(row_id: str | None, context: str | None) -> uuid.UUID | None:
    if bool(row_id) == bool(context):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, "give one row id, or --context"))
    try:
        return uuid.UUID(row_id) if row_id else None
    except ValueError:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{row_id!r} is not an outbox row id (UUID)"))


def _alone(name: str, *args: Any) -> Any:
    """One of the outbox repository's functions for parked rows, on a connection of its own."""
    from seamq.pg import outbox_repo  # the database driver loads with the command that needs it
    from seamq.pg.alone import alone

    return run(alone(settings().database_dsn(), getattr(outbox_repo, name), *args))
