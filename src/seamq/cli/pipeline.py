"""`seamq pipeline`: the Spark data pipeline (event lake, delivery KPIs, reconcile, lake replay)."""

from __future__ import annotations

import signal
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from seamq.cli.common import console, run, settings
from seamq.model import ErrorCode, SeamqError

app = typer.Typer(help="Data pipeline on Spark: event lake, delivery KPIs, reconcile, replay.", no_args_is_help=True)


@app.command()
def lake(
    stream: str = typer.Option(..., "--stream", help="The JetStream stream, e.g. SEA_EVENTS."),
    path: Path = typer.Option(Path(".seamq/lake"), "--lake", help="Lake folder (Parquet)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint folder (default: <lake>/_checkpoints/<stream>)."),
    master: Optional[str] = typer.Option(None, help="Spark master (default: pipeline.master, local[*])."),
    available_now: bool = typer.Option(False, "--available-now", help="Read what is there now, then stop."),
    max_records: int = typer.Option(50_000, help="Most messages per micro-batch."),
) -> None:
    """Stream -> Parquet lake partitioned by context / event_type / date, exactly once across restarts."""
    from seamq.pipeline.lake import keep_following, start_lake
    from seamq.pipeline.spark import spark_session

    current = settings()
    _reachable(current, stream=stream)
    with spark_session(master, app=f"seamq-lake-{stream}", settings=current.pipeline) as spark:
        def start():
            return start_lake(spark, nats=current.nats, stream=stream, lake=path,
                              checkpoint=checkpoint or path / "_checkpoints" / stream,
                              max_records=max_records, available_now=available_now)

        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        console.print(f"lake: {stream} -> {path} (Ctrl-C to stop)")
        try:
            keep_following(start, lambda batch, rows: console.print(f"batch {batch}: {rows} events"),
                           lambda: bool(stopping))
        except KeyboardInterrupt:
            for query in spark.streams.active:
                query.stop()


@app.command()
def reconcile(
    repair: bool = typer.Option(False, "--repair", help="Re-publish events missing from their stream."),
    grace: float = typer.Option(60.0, help="Seconds a message may still be in flight before it counts as unprocessed."),
    master: Optional[str] = typer.Option(None, help="Spark master (default: pipeline.master, local[*])."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the findings as JSON here."),
    since: Optional[datetime] = typer.Option(None, "--since", help="Events that occurred from this time (UTC)."),
    until: Optional[datetime] = typer.Option(None, "--until", help="... until this time, excluded."),
) -> None:
    """Outbox vs streams vs inboxes: events a broker lost, and events never processed."""
    from rich.table import Table

    from seamq.cli.common import topology
    from seamq.pipeline.reconcile import reconcile as run_reconcile
    from seamq.pipeline.reconcile import report_text
    from seamq.pipeline.spark import spark_session

    current = settings()
    topo = topology(None, current)
    dsn = current.database_dsn()  # before the JVM starts: a missing setting is said in a second
    _reachable(current, database=True, nats=True)
    with spark_session(master, app="seamq-reconcile", settings=current.pipeline) as spark:
        report = run_reconcile(spark, dsn=dsn, nats=current.nats, topology=topo,
                               grace=grace, repair=repair, since=_utc(since), until=_utc(until))
    table = Table("where", "finding", "count", title="reconcile")
    for stream, ids in report.missing_from_stream.items():
        table.add_row(stream, "published in the outbox, missing from the stream", str(len(ids)))
    for consumer, ids in report.unprocessed.items():
        table.add_row(consumer, f"in the stream over {grace:g}s, never processed", str(len(ids)))
    console.print(table)
    if repair:
        console.print(f"repaired: re-published {report.repaired} events from the outbox")
    if json_out:
        json_out.write_text(report_text(report))


@app.command()
def kpis(
    out: Path = typer.Option(Path(".seamq/kpis"), "--out", help="Folder for kpis.parquet, summary.json, report.html."),
    master: Optional[str] = typer.Option(None, help="Spark master (default: pipeline.master, local[*])."),
    since: Optional[datetime] = typer.Option(None, "--since", help="Events that occurred from this time (UTC)."),
    until: Optional[datetime] = typer.Option(None, "--until", help="... until this time, excluded."),
) -> None:
    """PRD-022 delivery KPIs per context, event type and hour; flags breaches of the targets."""
    from rich.table import Table

    from seamq.pipeline.kpis import compute, summary, write_report
    from seamq.pipeline.spark import spark_session

    current = settings()
    dsn = current.database_dsn()  # before the JVM starts
    _reachable(current, database=True)
    with spark_session(master, app="seamq-kpis", settings=current.pipeline) as spark:
        frame = compute(spark, dsn, _utc(since), _utc(until))
        frame.write.mode("overwrite").parquet(str(out / "kpis.parquet"))
        rows = frame.collect()
    report = summary(rows)
    page = write_report(rows, report, out)
    table = Table("context", "delivered", "duplicates", "DLQ", "worst hourly p99 ms", "breaches", title="KPIs")
    for context, c in report["contexts"].items():
        pct = lambda v: "-" if v is None else f"{v * 100:.3f}%"  # noqa: E731
        table.add_row(context, pct(c["delivery_rate"]), pct(c["duplicate_rate"]), pct(c["dlq_rate"]),
                      f"{c['worst_hour_p99_ms']:.1f}", ", ".join(c["breaches"]) or "none")
    console.print(table)
    console.print(f"report: {page}")


@app.command()
def replay(
    since: datetime = typer.Option(..., "--since", help="From this time (ISO 8601, UTC), included."),
    until: datetime = typer.Option(..., "--until", help="Until this time, excluded."),
    event_type: Optional[str] = typer.Option(None, "--event-type", help="Only this event type."),
    path: Path = typer.Option(Path(".seamq/lake"), "--lake", help="Lake folder."),
    master: Optional[str] = typer.Option(None, help="Spark master (default: pipeline.master, local[*])."),
) -> None:
    """Re-publish lake events of a time window into their streams; inboxes keep it exactly-once."""
    from rich.progress import Progress

    from seamq.pipeline.lake_replay import replay as run_replay
    from seamq.pipeline.spark import spark_session

    current = settings()
    _reachable(current, nats=True, lake=path)
    with (spark_session(master, app="seamq-lake-replay", settings=current.pipeline) as spark,
          Progress(console=console) as bar):
        task = bar.add_task("replaying", total=None)
        stored = run_replay(spark, nats=current.nats, lake=path, since=since, until=until,
                            event_type=event_type,
                            progress=lambda done, total: bar.update(task, completed=done, total=total))
    console.print(f"re-published {stored} events from {path}")


def _reachable(current, *, database: bool = False, nats: bool = False, stream: str | None = None,
               lake: Path | None = None) -> None:
    """What the job needs, checked before a JVM starts: an unreachable service or a missing stream
    or lake is said in seconds as error[CODE], not as a Spark stack trace."""
    if lake is not None and not any(lake.glob("context=*")):
        raise SeamqError(ErrorCode.NOT_FOUND, f"no event lake at {lake}: run `seamq pipeline lake` first, "
                                              "or give --lake")

    from seamq.doors import reachable

    run(reachable(current, database=database, nats=nats, stream=stream))


def _utc(moment: datetime | None) -> datetime | None:
    """Times on the command line without a zone are UTC, as the KPIs' hours are."""
    return moment.replace(tzinfo=timezone.utc) if moment and moment.tzinfo is None else moment
