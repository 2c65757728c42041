"""`seamq console`: the operations console in a browser (docs/console.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from seamq.cli.common import TopologyOption, exit_with, run, settings, topology
from seamq.cli.jobs import LOOPBACK
from seamq.model import ErrorCode, SeamqError


def console(
    host: Optional[str] = typer.Option(None, help="Address to listen on (default SEAMQ_CONSOLE__HOST, 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="Port to listen on (default SEAMQ_CONSOLE__PORT, 8090)."),
    topology_file: Optional[Path] = TopologyOption,
    no_auth: bool = typer.Option(False, "--no-auth", help="Listen beyond loopback with no users configured "
                                                          "(anyone who reaches the port can replay and purge)."),
) -> None:
    """Serve the operations console: overview, dead letters, jobs (PostgreSQL, NATS and the job server from
    the usual settings; users from SEAMQ_CONSOLE__USERS)."""
    try:
        from seamq.console.serve import serve
    except ModuleNotFoundError as exc:  # an install without the extra: say which to add, not a traceback
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"seamq console needs the console extra ({exc.name} is not "
                                                       "installed): pip install 'seamq[console]'"))
    current = settings()
    host = host or current.console.host
    port = current.console.port if port is None else port
    if host not in LOOPBACK and current.console.users is None and not no_auth:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--host {host} with no users: anyone who reaches the port "
                             "could replay and purge dead letters. Set SEAMQ_CONSOLE__USERS (docs/console.md, "
                             "\"Signing in\"), or pass --no-auth behind a proxy that authenticates"))
    run(serve(current, topology(topology_file, current), host=host, port=port))
