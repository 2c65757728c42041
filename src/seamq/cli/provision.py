"""`seamq provision`: streams, DLQ streams and consumers made to match the topology, or the diff
with the server (`--dry-run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, TopologyOption, console, print_json, run, settings, topology


def provision(
    topology_file: Optional[Path] = TopologyOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff with the server; change nothing."),
    force: bool = typer.Option(False, "--force", help="Allow destructive changes (recreating streams/consumers)."),
    migrate_partitions: bool = typer.Option(
        False, "--migrate-partitions",
        help="Move consumers whose `partitions` changed, where they left off (their processes must be stopped)."),
    as_json: bool = JsonOption,
) -> None:
    """Create or update streams, DLQ streams and consumers to match the topology."""
    current = settings()
    topo = topology(topology_file, current)

    from seamq.doors import provision as provisioned

    changes = run(provisioned(current, topo, dry_run=dry_run, force=force, migrate=migrate_partitions))
    if as_json:
        print_json([{"kind": c.kind, "name": c.name, "action": c.action, "destructive": c.destructive_reasons,
                     "differences": [{"field": f, "server": have, "file": want} for f, have, want in c.diffs]}
                    for c in changes])
    else:
        print_changes(changes, dry_run=dry_run)
    if dry_run and any(c.destructive for c in changes):
        raise typer.Exit(3)


def print_changes(changes, *, dry_run: bool = False) -> None:
    table = Table("kind", "name", "action" if not dry_run else "would", "differences (server -> file)",
                  title="dry run: nothing changed" if dry_run else None)
    colours = {"create": "green", "update": "yellow", "recreate": "red", "unchanged": "dim", "migrate": "red"}
    for c in changes:
        diffs = "\n".join(f"{f}: {_shown(f, have)} -> {_shown(f, want)}" for f, have, want in c.diffs)
        if c.destructive:
            diffs += "\n[red]destructive: " + "; ".join(c.destructive_reasons) + "[/red]"
        table.add_row(c.kind, c.name, f"[{colours[c.action]}]{c.action}[/]", diffs)
    console.print(table)


_DURATIONS = {"max_age", "duplicate_window", "ack_wait", "priority_timeout"}  # seconds in every diff


def _shown(field: str, value) -> str:
    """A diff's value as the topology file would write it: durations as 7d, 2m."""
    from seamq.units import format_duration

    if field in _DURATIONS and isinstance(value, (int, float)) and value:
        return format_duration(value)
    return repr(value)
