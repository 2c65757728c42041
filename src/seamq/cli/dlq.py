"""`seamq dlq`: dead letters for people: list, show, replay now, purge."""

from __future__ import annotations

import dataclasses
import getpass
import json
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress
from rich.syntax import Syntax
from rich.table import Table

from seamq.cli.common import (
    JsonOption, TopologyOption, console, duration, exit_with, id_prefix, print_json, run, settings, the_one, topology,
)
from seamq.dead_letter import DeadLetterRow, DlqFilter, State
from seamq.model import ErrorCode, SeamqError
from seamq.settings import Settings

app = typer.Typer(help="Dead letters: list, show, replay now, purge.", no_args_is_help=True)

Consumer = typer.Option(None, "--consumer", help="Only this consumer's dead letters.")
Context = typer.Option(None, "--context", help="Only dead letters of consumers of this (target) context.")
EventType = typer.Option(None, "--event-type", help="Only this event type.")
ReasonOpt = typer.Option(None, "--reason", help="Only this reason, e.g. handler_rejected, max_deliver.")
OlderThan = typer.Option(None, "--older-than", help="Only dead letters older than this, e.g. 1h.")
Limit = typer.Option(1000, "--limit", help="At most this many.")
ACTOR = f"cli:{getpass.getuser()}"  # who did it, in the record of actions (seamq.dlq_desk)


Purged = typer.Option(False, "--purged", help="Purged dead letters too (their DLQ copy is gone).")


def _filter(consumer, context, event_type, reason, older_than, limit, message_id=None, purged=False) -> DlqFilter:
    age = duration("--older-than", older_than) if older_than else None
    return DlqFilter(consumer=consumer, context=context, event_type=event_type, reason=reason,
                     older_than=age, prefix=id_prefix(message_id, "message id") if message_id else None, purged=purged, limit=limit)


def one_message(rows: list[DeadLetterRow], value: str, what: str) -> list[DeadLetterRow]:
    """The rows of the one message a prefix names; refused when it names none or several."""
    the_one((str(row.message_id) for row in rows), value, what)
    return rows


async def _select(current: Settings, selection: DlqFilter) -> list[DeadLetterRow]:
    from seamq.doors import dead_letter_reader

    async with dead_letter_reader(current) as reader:
        return await reader.select(selection)


@app.command("list")
def list_(consumer: Optional[str] = Consumer, context: Optional[str] = Context, event_type: Optional[str] = EventType,
          reason: Optional[str] = ReasonOpt, older_than: Optional[str] = OlderThan, limit: int = Limit,
          purged: bool = Purged, as_json: bool = JsonOption) -> None:
    """Dead-lettered and exhausted messages, oldest first (purged ones with --purged)."""
    rows = run(_select(settings(), _filter(consumer, context, event_type, reason, older_than, limit,
                                                          purged=purged)))
    if as_json:
        return print_json([row.plain() for row in rows])  # every inbox column, the DLQ metadata as stored
    # Cells wrap rather than end in "…": a reason cut short is no reason. Ids are shown whole: a
    # UUIDv7 begins with its millisecond, so the messages of one batch share any short head of it.
    table = Table(title=f"{len(rows)} dead letters")
    for name in ("id", "consumer", "event", "reason", "status", "tries", "replays", "next replay",
                 "dead-lettered"):
        # Ids and consumers are copied whole into commands, and a reason is read whole: never on two lines.
        table.add_column(name, overflow="fold", no_wrap=name in ("id", "consumer", "reason"),
                         min_width=36 if name == "id" else None)
    for row in rows:
        state = row.state
        status = "purged" if state.purged_at else row.status
        table.add_row(str(row.message_id), row.consumer, row.event, state.reason or "?", status,
                      str(row.attempts), str(state.replay_attempts),
                      _minute(state.next_replay_at), _minute(state.dead_lettered_at))
    console.print(table)


@app.command()
def show(message_id: str = typer.Argument(..., help="The message id, or its first characters."),
         topology_file: Optional[Path] = TopologyOption, as_json: bool = JsonOption) -> None:
    """One dead letter: its inbox record, every failed attempt, and the DLQ copy with the original."""
    current = settings()
    topo = topology(topology_file, current)
    selection = _filter(None, None, None, None, None, 50, message_id, purged=True)

    async def go():
        from seamq.wiring import dlq_desk

        rows = one_message(await _select(current, selection), message_id, "dead letter")
        async with dlq_desk(current, topo) as desk:  # NATS only once there is something to show
            return await desk.detail(rows)

    rows = run(go())
    if as_json:
        return print_json([row.plain() for row in rows])
    for row in rows:
        console.print(record_table(row, f"dead letter {row.message_id} ({row.consumer})"))
        console.print(Syntax(json.dumps(row.dlq_copy, indent=2, ensure_ascii=False), "json", word_wrap=True))


def record_table(row: DeadLetterRow, title: str) -> Table:
    """An inbox row for people: its fields, its DLQ state (what is set), and its failed attempts."""
    table = Table("field", "value", title=title, show_header=False)
    for key in ("subject", "status", "attempts", "last_error", "received_at", "processed_at"):
        if (value := getattr(row, key)) is not None:
            table.add_row(key, str(value))
    for field in dataclasses.fields(State):
        if (value := getattr(row.state, field.name)) != field.default:
            table.add_row(f"dlq.{field.name}", str(value))
    for attempt in row.failed_attempts or ():
        table.add_row(f"attempt {attempt.attempt}", f"{str(attempt.failed_at)[:23]}  {attempt.error}")
    return table


@app.command()
def replay(
    message_id: Optional[str] = typer.Argument(None, help="One message id; or use --all with filters."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter the filters select."),
    consumer: Optional[str] = Consumer, context: Optional[str] = Context, event_type: Optional[str] = EventType,
    reason: Optional[str] = ReasonOpt, older_than: Optional[str] = OlderThan, limit: int = Limit,
    topology_file: Optional[Path] = TopologyOption,
) -> None:
    """Re-publish now, bypassing the backoff (also exhausted and non-replayable ones)."""
    if bool(message_id) == all_:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, "give one message id, or --all (with optional filters)"))
    current = settings()
    topo = topology(topology_file, current)
    selection = _filter(consumer, context, event_type, reason, older_than, limit, message_id)

    async def go():
        from seamq.wiring import dlq_desk

        rows = await _select(current, selection)
        if message_id:
            rows = one_message(rows, message_id, "dead letter")
        if not rows:
            return 0, 0
        async with dlq_desk(current, topo) as desk:
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("replaying", total=len(rows))
                done = await desk.replay(rows, ACTOR, lambda n: progress.advance(task, n))
        return done.selected, done.done

    selected, replayed = run(go())
    if message_id and not selected:
        exit_with(SeamqError(ErrorCode.NOT_FOUND, f"no dead letter with message id {message_id}"))
    console.print(f"replayed {replayed} of {selected} selected dead letters")
    if replayed < selected:
        raise typer.Exit(1)


@app.command()
def purge(
    yes: bool = typer.Option(False, "--yes", help="Really delete the selected DLQ copies."),
    consumer: Optional[str] = Consumer, context: Optional[str] = Context, event_type: Optional[str] = EventType,
    reason: Optional[str] = ReasonOpt, older_than: Optional[str] = OlderThan, limit: int = Limit,
    topology_file: Optional[Path] = TopologyOption,
) -> None:
    """Delete dead letters from the DLQ stream; their inbox rows stay (marked purged) to keep deduplicating."""
    current = settings()
    topo = topology(topology_file, current)
    selection = _filter(consumer, context, event_type, reason, older_than, limit)
    rows = run(_select(current, selection))
    if not yes:
        exit_with(SeamqError(ErrorCode.CONFIRMATION_NEEDED, f"{len(rows)} dead letters selected; add --yes to purge them"))

    async def go():
        from seamq.wiring import dlq_desk

        async with dlq_desk(current, topo) as desk:
            return await desk.purge(rows, ACTOR)

    console.print(f"purged {run(go()).done} dead letters")


def _minute(value) -> str:
    """An ISO time as people scan a list: to the minute, UTC."""
    return str(value).replace("T", " ")[:16] if value else "-"
