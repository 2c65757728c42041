"""`seamq jobs`: the Open Job Spec job server (docs/jobs.md)."""

from __future__ import annotations

import typer

from seamq.cli.common import exit_with, run, settings
from seamq.model import ErrorCode, SeamqError

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


@app.command()
def worker(
    url: str = typer.Option(..., help="The OJS server, e.g. http://127.0.0.1:8080."),
    queue: list[str] = typer.Option(..., "--queue", "-q", help="Queue to take jobs from (repeat for several, "
                                                                "in order of preference)."),
    handler: str = typer.Option(..., help="The job function, as package.module:function (async or not); "
                                          "called with the job's args, and job=<envelope> if it has that parameter."),
    concurrency: int = typer.Option(10, min=1, max=1000, help="Jobs run at once."),
    visibility_timeout: float = typer.Option(60.0, min=1.0, help="Seconds a job stays leased to this worker "
                                                                  "without a heartbeat (it heartbeats every quarter)."),
    grace: float = typer.Option(25.0, min=0.0, help="On SIGTERM, seconds running jobs get to finish before they "
                                                    "are released to other workers."),
    worker_id: str = typer.Option("", help="Name in the server's records (default: host-pid)."),
) -> None:
    """Run jobs through a Python function until SIGTERM: ack on return, nack with the exception."""
    from seamq.jobs.worker import WorkerConfig, run_worker
    from seamq.registry import import_object

    try:
        function = import_object(handler)
    except SeamqError as exc:
        exit_with(exc)
    if not callable(function):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{handler!r} is not a function"))
    config = WorkerConfig(queues=tuple(queue), concurrency=concurrency, visibility_timeout=visibility_timeout,
                          grace=grace, worker_id=worker_id)
    run(run_worker(url, function, config))
