"""The long-running commands: relay, consume, replay, dev; and provision, which they rely on."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, TopologyOption, console, exit_with, print_json, run, settings, topology
from seamq.model import ErrorCode, SeamqError


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

    async def go():
        from seamq.nats.connect import connect
        from seamq.nats.provision import apply, plan

        nc = await connect(current.nats, name="seamq-provision", persistent=False)
        try:
            js = nc.jetstream()
            return await (plan(js, topo) if dry_run else apply(js, topo, force=force, migrate=migrate_partitions))
        finally:
            await nc.close()

    changes = run(go())
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
    from seamq.topology import format_duration

    if field in _DURATIONS and isinstance(value, (int, float)) and value:
        return format_duration(value)
    return repr(value)


def _serve(current, name: str, worker) -> None:
    """Run one worker coroutine until SIGTERM/SIGINT, with /metrics, /healthz and /readyz if a port is set.

    `name` is what its PostgreSQL sessions show in pg_stat_activity (`application_name`), with the
    process id, unless the DSN or PGAPPNAME names them already: which process holds a lock, or waits."""
    os.environ.setdefault("PGAPPNAME", f"seamq {name} pid {os.getpid()}"[:63])
    _collect_less()

    async def go():
        from seamq.health import Health
        from seamq.http import probes
        from seamq.wiring import stop_on_signals

        health = Health(current.health_stale_after)
        server = await probes.serve(health, current.metrics_host, current.metrics_port) if current.metrics_port else None
        stop = asyncio.Event()
        received = stop_on_signals(stop)
        try:
            await worker(stop, health)
        finally:
            if server:
                await server.cleanup()
        return received

    if signal.SIGINT in run(go()):  # Ctrl-C: stopped cleanly, and says it was interrupted (docs/errors.md)
        raise typer.Exit(130)


def _collect_less() -> None:
    """A worker makes a few short-lived objects per message and almost no reference cycles, while
    Python's collector, run every 700 allocations, kept walking them and everything the imports made:
    10% of a consumer's CPU (0.58 s of 5.7 s for 100k messages, measured with gc.callbacks). Here the
    process is ours (the command runs it; embedding run_consumer leaves the host's collector alone)."""
    gc.freeze()  # what imports and settings made lives as long as the process: collections skip it
    gc.set_threshold(10_000, 50, 100)


def relay(topology_file: Optional[Path] = TopologyOption) -> None:
    """Publish outbox rows to JetStream (CMD-050) until SIGTERM."""
    from seamq.wiring import run_relay

    current = settings()
    topo = topology(topology_file, current)
    _serve(current, "relay", lambda stop, health: run_relay(current, topo, stop, health))


def consume(
    consumer: str = typer.Option(..., "--consumer", help="A durable consumer of the topology, e.g. sea__from_vibespro."),
    topology_file: Optional[Path] = TopologyOption,
    handler_url: Optional[str] = typer.Option(None, help="HTTP handler (POST /handle) for every event without a route."),
    registry: Optional[str] = typer.Option(None, help="Registry import path, e.g. registry_generated:REGISTRY."),
) -> None:
    """Pull from a durable consumer, record in the inbox, dispatch, ACK / redeliver / dead-letter (CMD-051/052)."""
    from seamq.wiring import run_consumer

    current = settings()
    overrides = {k: v for k, v in dict(handler_url=handler_url, registry=registry).items() if v}
    if overrides:
        current = current.model_copy(update={"consumer": current.consumer.model_copy(update=overrides)})
    topo = topology(topology_file, current)
    if consumer not in topo.consumers:
        exit_with(SeamqError(ErrorCode.INVALID_TOPOLOGY,
                             f"no consumer {consumer!r}; known: {', '.join(sorted(topo.consumers))}"))
    _serve(current, f"consume {consumer}", lambda stop, health: run_consumer(current, topo, consumer, stop,
                                                                             health=health))


def replay(topology_file: Optional[Path] = TopologyOption) -> None:
    """Replay dead letters to their original subject with exponential backoff and jitter (REQ-059)."""
    from seamq.wiring import run_replay

    current = settings()
    topo = topology(topology_file, current)
    _serve(current, "replay", lambda stop, health: run_replay(current, topo, stop, health))


def dev(
    data_dir: Optional[Path] = typer.Option(None, help="Where embedded services keep data (default .seamq/)."),
    topology_file: Optional[Path] = TopologyOption,
    exit_when_ready: bool = typer.Option(False, "--exit-when-ready", help="Stop once provisioned (smoke tests)."),
    demo: bool = typer.Option(True, "--demo/--no-demo", help="Write a demo workload (1% poison)."),
    run_for: Optional[float] = typer.Option(None, "--run-for", help="Stop after this many seconds."),
    cluster: int = typer.Option(1, "--cluster", min=1, max=5,
                                help="Embedded NATS as a JetStream cluster of this many servers (streams R3), "
                                     "and as many job servers."),
    services_only: bool = typer.Option(False, "--services-only",
                                       help="Only NATS and PostgreSQL, migrated and provisioned with your "
                                            "topology, until Ctrl-C: you run your own services and workers "
                                            "(docs/first-app.md)."),
    jobs: bool = typer.Option(True, "--jobs/--no-jobs", help="Run the job server too (on 8080, else a free port)."),
) -> None:
    """Run everything locally: embedded NATS and PostgreSQL, migrations, topology, workers, the job server, demo,
    dashboard."""
    from seamq.dev.runtime import run_dev

    current = settings()
    if (topology_file or current.topology_file) and not services_only:
        # The demo's handler services would answer for the consumers of a topology that is not theirs.
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, "the demo (its handler services and workload) runs on the "
                             "shipped topology; with your own, run `seamq dev --services-only --topology FILE` "
                             "and start your services and workers (docs/first-app.md)"))
    if cluster > 1 and current.replicas is None:  # what a cluster is for: SDS-047 §10's replicas 3
        current = current.model_copy(update={"replicas": min(cluster, 3)})
    run(run_dev(current, topology(topology_file, current), data_dir or current.embedded.data_dir,
                console=console, exit_when_ready=exit_when_ready, demo=demo, run_for=run_for, cluster=cluster,
                services_only=services_only, jobs_port=8080 if jobs else None))
