"""`seamq dev`: everything on one machine, on embedded NATS and PostgreSQL (docs/first-app.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from seamq.cli.common import TopologyOption, console, exit_with, run, settings, topology
from seamq.model import ErrorCode, SeamqError


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
    nats_port: Optional[int] = typer.Option(None, "--nats-port", min=1, max=65535,
                                            help="nats-server's port (default 4222 when free, else a free one)."),
    pg_port: Optional[int] = typer.Option(None, "--pg-port", min=1, max=65535,
                                          help="PostgreSQL's port (default 5432 when free, else a free one)."),
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
    ports = {k: v for k, v in (("nats_port", nats_port), ("pg_port", pg_port)) if v is not None}
    if ports:
        current = current.model_copy(update={"embedded": current.embedded.model_copy(update=ports)})
    if cluster > 1 and current.replicas is None:  # what a cluster is for: SDS-047 §10's replicas 3
        current = current.model_copy(update={"replicas": min(cluster, 3)})
    run(run_dev(current, topology(topology_file, current), data_dir or current.embedded.data_dir,
                console=console, exit_when_ready=exit_when_ready, demo=demo, run_for=run_for, cluster=cluster,
                services_only=services_only, jobs_port=8080 if jobs else None))
