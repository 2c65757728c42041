"""Run the benchmarks: `make bench` (full) or `make bench-quick` (smoke run, CI).

Each scenario prints a table and the whole run is written to
bench/results/latest.json (and a timestamped copy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import machine
from bench.summary import summary

SCENARIOS = ["relay", "history", "retention", "scale", "consumer", "e2e", "delayed", "http", "spark", "peer", "peers_relay", "jobs", "peers_jobs",
             "floors"]
# Tables at scale (issue 45): a day of 10 million rows dropped, 50 million rows of history a table; 6 and
# about 40 minutes. `make bench-scale` runs them; a quick run takes them too.
APART = {"retention", "scale"}


def show(console: Console, result, title: str) -> None:
    columns = list(dict.fromkeys(k for row in result.rows for k in row))  # rows may differ in columns
    table = Table(*columns, title=title)
    for row in result.rows:
        table.add_row(*(str(row.get(k, "")) for k in columns))
    console.print(table)
    for note in result.notes:
        console.print(f"  note: {note}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: checks that it works, no real numbers")
    parser.add_argument("--only", help=f"comma-separated scenarios (default: every one, but {', '.join(sorted(APART))} "
                                       "only in a quick run)")
    parser.add_argument("--size", type=int, default=256, help="payload bytes")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    # SIGTERM (a timeout, a CI job cancelled) cancels the run, so every scenario's `services()`
    # stops its nats-server and PostgreSQL and removes their folders instead of leaving them running.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    console = Console(width=140)
    count = 2_000 if args.quick else 100_000
    results = []
    started = time.time()
    took: dict[str, float] = {}  # seconds per scenario, services and all: where a run's time goes
    for name in args.only.split(",") if args.only else [s for s in SCENARIOS if args.quick or s not in APART]:
        module = __import__(f"bench.{name}", fromlist=["run"])
        console.print(f"[bold]{name}[/bold] ...")
        began = time.time()
        produced = await module.run(count=count, size=args.size)
        took[name] = round(time.time() - began, 1)
        for result in produced if isinstance(produced, list) else [produced]:  # a scenario may have tables
            results.append(result)
            show(console, result, f"{result.scenario} ({count} events, {args.size} B payloads)")
    results.insert(0, summary(results))  # where seamq stands: first in the report, last on the screen
    show(console, results[0], "where seamq stands (this run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "quick": args.quick, "count": count, "payload_bytes": args.size,
              "seconds": round(time.time() - started, 1), "seconds_per_scenario": took,
              "scenarios": [asdict(r) for r in results]}
    text = json.dumps(report, indent=2)
    (out / "latest.json").write_text(text)
    (out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    console.print("seconds per scenario: " + ", ".join(f"{name} {seconds:g}" for name, seconds in took.items()))
    console.print(f"wrote {out / 'latest.json'} in {report['seconds']}s")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        sys.exit(128 + signal.SIGTERM)
