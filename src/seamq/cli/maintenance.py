"""`seamq inbox show|purge`, `seamq backlog`: keeping the tables healthy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, TopologyOption, console, duration, exit_with, print_json, run, settings, topology
from seamq.model import SeamqError
from seamq.topology import inbox_retention

inbox_app = typer.Typer(help="The inbox: show a message's record and attempts; purge processed rows.",
                        no_args_is_help=True)


@inbox_app.command("show")
def inbox_show(message_id: str = typer.Argument(..., help="The message id, or its first characters."),
               as_json: bool = JsonOption) -> None:
    """A message as each consumer's inbox has it, in any state, with every failed attempt."""
    from seamq.cli.common import id_prefix
    from seamq.cli.dlq import one_message, record_table
    from seamq.doors import dead_letter_reader

    prefix = id_prefix(message_id, "message id")

    async def go():
        async with dead_letter_reader(settings()) as reader:
            return await reader.inbox_record(prefix)

    rows = one_message(run(go()), message_id, "inbox message")
    if as_json:
        return print_json([row.plain() for row in rows])
    for row in rows:
        console.print(record_table(row, f"{row.message_id} in {row.consumer}"))


@inbox_app.command("purge")
def inbox_purge(
    older_than: str = typer.Option(..., "--older-than", help="Age of processed rows to delete, e.g. 30d."),
    topology_file: Optional[Path] = TopologyOption,
    batch: int = typer.Option(5000, help="Rows per DELETE."),
) -> None:
    """Delete processed inbox rows older than a window that still covers every possible redelivery."""
    from seamq.doors import tables_desk

    current = settings()
    try:
        seconds = inbox_retention(topology(topology_file, current), duration("--older-than", older_than),
                                  f"--older-than {older_than}", nak_max=current.consumer.nak_max,
                                  replay_window=current.replay.window)
    except SeamqError as exc:
        exit_with(exc)

    async def go():
        async with tables_desk(current) as desk:
            return await desk.purge_inbox(seconds, batch)

    console.print(f"processed inbox rows older than {older_than}: {run(go()).said}")


def backlog(as_json: bool = JsonOption) -> None:
    """Unpublished outbox rows per context (QRY-050) and unprocessed inbox rows per consumer (QRY-051)."""
    from seamq.doors import tables_desk

    async def go():
        async with tables_desk(settings()) as desk:
            return await desk.backlog()

    found = run(go())
    if as_json:
        return print_json(found.plain())
    table = Table("outbox context", "unpublished", "failing", "oldest", "delayed (deliver_at later)",
                  "parked (seamq outbox parked)", title="outbox (QRY-050)")
    for row in found.outbox:
        table.add_row(row.context, str(row.count), str(row.failing), str(row.oldest_at or "-"), str(row.delayed),
                      str(row.parked))
    console.print(table)
    table = Table("inbox consumer", "unprocessed", "oldest", title="inbox (QRY-051)")
    for consumer in found.inbox:
        table.add_row(consumer.consumer, str(consumer.unprocessed), str(consumer.oldest_at))
    console.print(table)
