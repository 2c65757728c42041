"""`seamq db`: versioned migrations shipped in the package."""

from __future__ import annotations

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, console, print_json, run, settings

app = typer.Typer(help="Database schema: versioned migrations shipped in the package.", no_args_is_help=True)


@app.command("upgrade")
def upgrade() -> None:
    """Apply missing migrations (idempotent; safe to run from several processes)."""
    from seamq.doors import upgrade as applying

    applied = run(applying(settings(), console.print))
    for m in applied:
        console.print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        console.print("schema is up to date")


@app.command("status")
def status(as_json: bool = JsonOption) -> None:
    """List migrations and when each was applied."""
    from seamq.doors import migrations as shipped

    migrations = run(shipped(settings()))
    if as_json:
        return print_json([{"version": s.version, "name": s.name, "applied_at": s.applied_at} for s in migrations])
    table = Table("version", "name", "applied at")
    for s in migrations:
        table.add_row(f"{s.version:04d}", s.name, str(s.applied_at) if s.applied_at else "[yellow]pending[/yellow]")
    console.print(table)
