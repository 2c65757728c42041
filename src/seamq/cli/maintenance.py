"""`seamq inbox show|purge`, `seamq backlog`: keeping the tables healthy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, TopologyOption, console, duration, exit_with, print_json, run, settings, topology
from seamq.model import ErrorCode, SeamqError
from seamq.topology import inbox_retention_floor

inbox_app = typer.Typer(help="The inbox: show a message's record and attempts; purge processed rows.",
                        no_args_is_help=True)


@inbox_app.command("show")
def inbox_show(message_id: str = typer.Argument(..., help="The message id, or its first characters."),
               as_json: bool = JsonOption) -> None:
    """A message as each consumer's inbox has it, in any state, with every failed attempt."""
    from seamq.cli.common import id_prefix
    from seamq.cli.dlq import one_message, record_table

    prefix = id_prefix(message_id, "message id")
    current = settings()

    from seamq.pg import dlq_repo
    from seamq.pg.alone import alone

    rows = one_message(run(alone(current.database_dsn(), dlq_repo.inbox_rows, prefix)), message_id, "inbox message")
    rows = run(alone(current.database_dsn(), dlq_repo.with_attempts, rows))
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
    current = settings()
    topo = topology(topology_file, current)
    seconds = duration("--older-than", older_than)
    replay = current.replay
    replay_window = replay.max_delay * replay.max_attempts
    floor = inbox_retention_floor(topo, nak_max=current.consumer.nak_max, replay_window=replay_window)
    if seconds <= floor:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, (
            f"--older-than {older_than} is too short: a copy of a message may still arrive up to {floor:g}s "
            "(duplicate window + max_deliver x max(ack_wait, NAK delay) + DLQ replay window) after it was first "
            "seen; purging sooner could process it twice")))

    from seamq.pg.alone import alone
    from seamq.pg.inbox_repo import purge_inbox

    purged = run(alone(current.database_dsn(), purge_inbox, seconds, batch))
    console.print(f"processed inbox rows older than {older_than}: {purged.rows}")


def backlog(as_json: bool = JsonOption) -> None:
    """Unpublished outbox rows per context (QRY-050) and unprocessed inbox rows per consumer (QRY-051)."""
    current = settings()

    async def go():
        from seamq.pg.outbox_repo import PgOutbox
        from seamq.pg.sql import query
        from seamq.wiring import pg_pool

        async with pg_pool(current.database_dsn(), one_shot=True) as pool:
            outbox = await PgOutbox(pool).backlog()
            async with pool.connection() as conn:
                inbox = await (await conn.execute(query("inbox_backlog"))).fetchall()
            return outbox, inbox

    outbox, inbox = run(go())
    if as_json:
        return print_json({"outbox": [dict(row) for row in outbox],
                           "inbox": [{"consumer": c, "unprocessed": n, "oldest_at": t} for c, n, t in inbox]})
    table = Table("outbox context", "unpublished", "failing", "oldest", "delayed (deliver_at later)",
                  "parked (seamq outbox parked)", title="outbox (QRY-050)")
    for row in outbox:
        table.add_row(row["context"], str(row["count"]), str(row["failing"]), str(row["oldest_at"] or "-"),
                      str(row["delayed"]), str(row["parked"]))
    console.print(table)
    table = Table("inbox consumer", "unprocessed", "oldest", title="inbox (QRY-051)")
    for consumer, count, oldest in inbox:
        table.add_row(consumer, str(count), str(oldest))
    console.print(table)
