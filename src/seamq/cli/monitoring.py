"""`seamq monitoring`: the Grafana dashboard and Prometheus alerting rules shipped with seamq."""

from __future__ import annotations

from importlib.resources import files

import typer

app = typer.Typer(help="Dashboards and alerts for the metrics seamq exports.", no_args_is_help=True)


def shipped(name: str) -> str:
    return files("seamq").joinpath("monitoring", name).read_text()


@app.command()
def rules() -> None:
    """Print the Prometheus alerting rules (outbox age, relay errors, DLQ rate, p99, stalled consumers)."""
    typer.echo(shipped("prometheus-rules.yaml"), nl=False)


@app.command()
def dashboard() -> None:
    """Print the Grafana dashboard (JSON, to import; it asks for a Prometheus data source)."""
    typer.echo(shipped("grafana-dashboard.json"), nl=False)
