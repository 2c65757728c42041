"""The `seamq` command line: one command group per concept of the spec."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from seamq.cli import console, db, dev, dlq, jobs, maintenance, monitoring, outbox, pipeline, provision, registry, workers

app = typer.Typer(
    help="seamq: transactional outbox, JetStream relay, inbox consumers and dead letters.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"seamq {version('seamq')}")
        raise typer.Exit()


@app.callback()
def options(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML settings file (also SEAMQ_CONFIG)."),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="debug, info, warning, error."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if config:
        os.environ["SEAMQ_CONFIG"] = str(config)
    import sys

    from seamq.cli.common import report_crash
    from seamq.observability import configure_logging

    sys.excepthook = report_crash

    configure_logging(log_level or os.environ.get("SEAMQ_LOG_LEVEL", "info"))


for command in (dev.dev, provision.provision, workers.relay, workers.consume, workers.replay, workers.audit,
                maintenance.backlog):
    app.command()(command)
app.command()(registry.asyncapi)
app.command()(console.console)
app.add_typer(db.app, name="db")
app.add_typer(dlq.app, name="dlq")
app.add_typer(registry.app, name="registry")
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(jobs.app, name="jobs")
app.add_typer(outbox.app, name="outbox")
app.add_typer(maintenance.inbox_app, name="inbox")
app.add_typer(monitoring.app, name="monitoring")


def main(args: list[str] | None = None) -> None:
    """The `seamq` command. A failure a person can act on, wherever a command meets it, ends in
    `error[CODE]: message` and its exit code; only a bug shows a traceback."""
    import sys

    from seamq.cli.common import report
    from seamq.doors import coded

    try:
        app(args=args, prog_name="seamq")
    except Exception as exc:
        error = coded(exc)
        if error is None:
            raise
        sys.exit(report(error))
