"""`seamq db`: versioned migrations shipped in the package."""

from __future__ import annotations

import typer
from rich.table import Table

from seamq.cli.common import console, run, settings

app = typer.Typer(help="Database schema: versioned migrations shipped in the package.", no_args_is_help=True)


@app.command("upgrade")
def upgrade() -> None:
    """Apply missing migrations (idempotent; safe to run from several processes)."""
    from seamq.pg import migrate

    applied = run(migrate.upgrade(settings().database_dsn()))
    for m in applied:
        console.print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        console.print("schema is up to date")


@app.command("status")
def status() -> None:
    """List migrations and when each was applied."""
    from seamq.pg import migrate

    table = Table("version", "name", "applied at")
    for s in run(migrate.status(settings().database_dsn())):
        table.add_row(f"{s.version:04d}", s.name, str(s.applied_at) if s.applied_at else "[yellow]pending[/yellow]")
    console.print(table)
