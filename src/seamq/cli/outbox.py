"""`seamq outbox`: purge published rows; see, move, retry or drop the rows the relay parked.

The rules are the desk's (seamq.tables_desk); this module only reads options and prints.
"""

from __future__ import annotations

import uuid
from typing import Awaitable, Callable, Optional, TypeVar

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, console, duration, exit_with, print_json, run, settings
from seamq.model import ErrorCode, SeamqError, validate_token
from seamq.tables_desk import TablesDesk, named

T = TypeVar("T")

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
    purged = _at_desk(lambda desk: desk.purge_outbox(seconds, batch))
    console.print(f"published rows older than {older_than}: {purged.said}")


@app.command()
def parked(context: Optional[str] = Context, limit: int = typer.Option(1000, "--limit"),
           as_json: bool = JsonOption) -> None:
    """Rows the relay can never publish as they are, oldest first, with why."""
    rows = _at_desk(lambda desk: desk.parked(context, None, limit))
    if as_json:
        return print_json([row._asdict() for row in rows])
    table = Table("id", "context", "event", "aggregate", "why", "parked at", title=f"{len(rows)} parked rows")
    for row in rows:
        table.add_row(str(row.id), row.context, f"{row.event_type}.v{row.event_version}",
                      f"{row.aggregate_type}/{row.aggregate_id}", row.parked_reason, str(row.parked_at)[:19])
    console.print(table)


@app.command()
def move(context: str = typer.Option(..., "--context", help="The parked rows' context (e.g. a typo)."),
         to: str = typer.Option(..., "--to", help="The context they belong to.")) -> None:
    """Give parked rows of a context another context, and hand them back to the relay."""
    _refused(validate_token, to, "context")
    console.print(f"moved {_at_desk(lambda desk: desk.move(context, to))} parked rows from {context} to {to}")


@app.command()
def retry(row_id: Optional[str] = Id, context: Optional[str] = Context) -> None:
    """Hand parked rows back to the relay as they are (after its topology gained their context)."""
    row = _id(row_id, context)
    console.print(f"handed {_at_desk(lambda desk: desk.retry(context, row))} parked rows back to the relay")


@app.command()
def drop(row_id: Optional[str] = Id, context: Optional[str] = Context,
         yes: bool = typer.Option(False, "--yes", help="Really delete them: these events will never be sent.")) -> None:
    """Delete parked rows: their events are never published."""
    row = _id(row_id, context)
    console.print(f"dropped {_at_desk(lambda desk: desk.drop(context, row, confirmed=yes))} parked rows")


def _id(row_id: str | None, context: str | None) -> uuid.UUID | None:
    """The row an id names; refused, before anything connects, unless one row or one context is named."""
    try:
        row = uuid.UUID(row_id) if row_id else None
    except ValueError:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{row_id!r} is not an outbox row id (UUID)"))
    _refused(named, context, row)
    return row


def _refused(rule: Callable[..., object], *args: object) -> None:
    try:
        rule(*args)
    except SeamqError as exc:
        exit_with(exc)


def _at_desk(work: Callable[[TablesDesk], Awaitable[T]]) -> T:
    """One piece of the desk's work, on a connection of its own."""
    from seamq.doors import tables_desk

    async def go() -> T:
        async with tables_desk(settings()) as desk:
            return await work(desk)
    return run(go())
