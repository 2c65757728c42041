"""Delivery KPIs of PRD-022, per context, event type and hour, computed in Spark.

- delivery rate: published outbox rows / all outbox rows;
- duplicate rate: duplicate deliveries the inboxes absorbed / inbox rows;
- DLQ rate: dead-lettered (or exhausted) inbox rows / inbox rows;
- end-to-end latency (inbox processed_at - occurred_at) p50/p95/p99, exact;
- relay lag (published_at - created_at) p50/p99.

A delayed event (outbox.add(..., deliver_at=)) counts both from its
deliver_at: held until then on purpose, it is not late.

An inbox row belongs to the context that produced the event, which is the
source in its consumer's name (`{target}__from_{source}`). Output: Parquet
rows, a JSON summary that flags breaches of the PRD targets, and one HTML
file with the numbers and small inline SVG charts, readable offline.
"""

from __future__ import annotations

import html
import json
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from seamq.model import CONSUMER_SEPARATOR
from seamq.pipeline import pg_source

TARGETS = {"delivery_rate_min": 0.9999, "duplicate_rate_max": 0.0, "dlq_rate_max": 0.001, "p99_ms_max": 500.0}


def _ms(start: str, end: str):
    return (F.col(end).cast("double") - F.col(start).cast("double")) * 1000


def compute(spark: SparkSession, dsn: str, since: datetime | None = None, until: datetime | None = None,
            partitions: int | None = None) -> DataFrame:
    """One row per (context, event_type, hour) of the events that occurred in [since, until)
    (default: all), read by the executors in `partitions` time ranges (seamq.pipeline.pg_source)."""
    outbox = (pg_source.read(spark, dsn, "outbox_kpis", since, until, partitions)
              .withColumn("hour", F.date_trunc("hour", "occurred_at"))
              .groupBy("context", "event_type", "hour")
              .agg(F.count("*").alias("outbox_total"),
                   F.count("published_at").alias("published"),
                   F.percentile(_ms("due_at", "published_at"), F.array(F.lit(0.5), F.lit(0.99)))
                   .alias("relay_lag")))
    inbox = (pg_source.read(spark, dsn, "inbox_kpis", since, until, partitions)
             .withColumn("context", F.element_at(F.split("consumer", CONSUMER_SEPARATOR), 2))
             .withColumn("hour", F.date_trunc("hour", "occurred_at"))
             .where(F.col("event_type").isNotNull())
             .groupBy("context", "event_type", "hour")
             .agg(F.count("*").alias("inbox_total"),
                  F.sum("duplicates").alias("duplicates"),
                  F.sum(F.col("status").isin("dead_lettered", "exhausted").cast("int")).alias("dead_lettered"),
                  F.percentile(F.when(F.col("processed_at").isNotNull(), _ms("due_at", "processed_at")),
                               F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("e2e")))
    joined = outbox.join(inbox, ["context", "event_type", "hour"], "full_outer")
    return joined.select(
        "context", "event_type", "hour",
        F.coalesce("outbox_total", F.lit(0)).alias("outbox_total"),
        F.coalesce("published", F.lit(0)).alias("published"),
        (F.col("published") / F.col("outbox_total")).alias("delivery_rate"),
        F.coalesce("inbox_total", F.lit(0)).alias("inbox_total"),
        (F.col("duplicates") / F.col("inbox_total")).alias("duplicate_rate"),
        (F.col("dead_lettered") / F.col("inbox_total")).alias("dlq_rate"),
        F.col("e2e")[0].alias("e2e_p50_ms"), F.col("e2e")[1].alias("e2e_p95_ms"),
        F.col("e2e")[2].alias("e2e_p99_ms"),
        F.col("relay_lag")[0].alias("relay_lag_p50_ms"), F.col("relay_lag")[1].alias("relay_lag_p99_ms"),
    ).orderBy("context", "event_type", "hour")


def summary(rows: list) -> dict:
    """Per context over all hours, with the breaches of the PRD-022 targets."""
    contexts: dict[str, dict] = {}
    for r in rows:
        c = contexts.setdefault(r.context, {"outbox_total": 0, "published": 0, "inbox_total": 0,
                                            "duplicates": 0, "dead_lettered": 0, "worst_hour_p99_ms": 0.0})
        c["outbox_total"] += r.outbox_total
        c["published"] += r.published
        c["inbox_total"] += r.inbox_total
        c["duplicates"] += round((r.duplicate_rate or 0) * r.inbox_total)
        c["dead_lettered"] += round((r.dlq_rate or 0) * r.inbox_total)
        c["worst_hour_p99_ms"] = max(c["worst_hour_p99_ms"], r.e2e_p99_ms or 0.0)
    for c in contexts.values():
        c["delivery_rate"] = c["published"] / c["outbox_total"] if c["outbox_total"] else None
        c["duplicate_rate"] = c["duplicates"] / c["inbox_total"] if c["inbox_total"] else None
        c["dlq_rate"] = c["dead_lettered"] / c["inbox_total"] if c["inbox_total"] else None
        breaches = []
        if c["delivery_rate"] is not None and c["delivery_rate"] < TARGETS["delivery_rate_min"]:
            breaches.append("delivery_rate")
        if c["duplicate_rate"] and c["duplicate_rate"] > TARGETS["duplicate_rate_max"]:
            breaches.append("duplicate_rate")
        if c["dlq_rate"] and c["dlq_rate"] >= TARGETS["dlq_rate_max"]:
            breaches.append("dlq_rate")
        if c["worst_hour_p99_ms"] >= TARGETS["p99_ms_max"]:
            breaches.append("p99_latency")
        c["breaches"] = breaches
    return {"targets": TARGETS, "contexts": contexts}


def _bars(values: list[tuple[str, float]], unit: str, width: int = 560, bar: int = 18) -> str:
    """A small horizontal bar chart as inline SVG."""
    top = max((v for _, v in values), default=0) or 1
    rows = []
    for i, (label, value) in enumerate(values):
        y = i * (bar + 6)
        length = int((width - 220) * value / top)
        rows.append(f'<text x="0" y="{y + 13}" font-size="12">{html.escape(label)}</text>'
                    f'<rect x="160" y="{y}" width="{length}" height="{bar}" fill="#4c78a8"/>'
                    f'<text x="{165 + length}" y="{y + 13}" font-size="12">{value:.1f} {unit}</text>')
    return f'<svg width="{width}" height="{len(values) * (bar + 6)}">{"".join(rows)}</svg>'


def write_report(rows: list, report: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(report, indent=2, default=str, sort_keys=True))
    latency = [(f"{r.context}.{r.event_type} {str(r.hour)[:13]}h", r.e2e_p99_ms) for r in rows
               if r.e2e_p99_ms is not None]
    cells = "".join(
        f"<tr><td>{html.escape(r.context)}</td><td>{html.escape(str(r.event_type))}</td><td>{r.hour}</td>"
        f"<td>{r.outbox_total}</td><td>{_pct(r.delivery_rate)}</td><td>{_pct(r.duplicate_rate)}</td>"
        f"<td>{_pct(r.dlq_rate)}</td><td>{_num(r.e2e_p50_ms)}</td><td>{_num(r.e2e_p99_ms)}</td>"
        f"<td>{_num(r.relay_lag_p99_ms)}</td></tr>" for r in rows)
    flags = "".join(f"<li><b>{html.escape(ctx)}</b>: {', '.join(c['breaches']) or 'all targets met'}</li>"
                    for ctx, c in report["contexts"].items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>seamq delivery KPIs</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 8px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>seamq delivery KPIs</h1><p>Targets (PRD-022): delivery &ge; 99.99%, duplicates 0%, DLQ &lt; 0.1%,
p99 &lt; 500 ms.</p><ul>{flags}</ul><h2>p99 end-to-end latency per event type and hour</h2>{_bars(latency, "ms")}
<h2>Per context, event type and hour</h2><table><tr><th>context</th><th>event</th><th>hour</th><th>outbox</th>
<th>delivered</th><th>duplicates</th><th>DLQ</th><th>p50 ms</th><th>p99 ms</th><th>relay lag p99 ms</th></tr>
{cells}</table></body></html>"""
    (out / "report.html").write_text(page)
    return out / "report.html"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.3f}%"


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"
