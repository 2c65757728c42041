"""`seamq jobs`: the Open Job Spec job server (docs/jobs.md)."""

from __future__ import annotations

import typer

from seamq.cli.common import run, settings

app = typer.Typer(help="Open Job Spec job server on NATS JetStream + KV.", no_args_is_help=True)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, help="Port to listen on."),
    test_mode: bool = typer.Option(False, "--test-mode",
                                   help="Conformance testing only: POST /ojs/v1/admin/reset empties every job, "
                                        "and heartbeats honour options.metadata.test_directive."),
) -> None:
    """Serve OJS 1.0 under /ojs/v1 until SIGTERM (NATS from SEAMQ_NATS__*)."""
    from seamq.jobs.serve import serve as serve_jobs

    current = settings()
    run(serve_jobs(current, host=host, port=port, test_mode=test_mode))
