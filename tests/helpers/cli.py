"""Parsing a `seamq ...` command line as the CLI parses it, without running it (docs' commands)."""

from __future__ import annotations

import typer

from seamq.cli import app

CLI = typer.main.get_command(app)


def parse_command(argv: list[str]) -> None:
    """As `seamq argv...` would parse it, without running it; fails naming what is wrong."""
    assert argv[0].endswith("seamq"), argv
    command, args = CLI, argv[1:]
    path = ["seamq"]
    while hasattr(command, "get_command"):  # a group (typer carries its own copy of click)
        name, args = args[0], args[1:]
        sub = command.get_command(command.context_class(command), name)
        assert sub is not None, f"{' '.join(path)} has no command {name!r}"
        command, path = sub, path + [name]
    try:
        command.make_context(" ".join(path), list(args))
    except Exception as exc:  # the usage error, as the user would see it
        raise AssertionError(f"{' '.join(argv)}: {exc}") from None
