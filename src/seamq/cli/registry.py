"""`seamq registry`: generate the handler registry from manifests, and check it in CI."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from seamq.cli.common import JsonOption, console, exit_with, print_json, report, settings
from seamq.model import ErrorCode, SeamqError

app = typer.Typer(help="Handler registry: generate from manifests (REQ-060), check in CI.", no_args_is_help=True)

Manifests = typer.Option(None, "--manifests", help="Folder of *.yaml manifests (default ./manifests).")
Out = typer.Option(None, "--out", help="Generated module (default ./registry_generated.py).")


def _paths(manifests: Optional[Path], out: Optional[Path]) -> tuple[Path, Path]:
    current = settings()
    return manifests or current.registry_manifests, out or current.registry_module


@app.command()
def generate(manifests: Optional[Path] = Manifests, out: Optional[Path] = Out) -> None:
    """Write the registry module (byte-identical for the same manifests) and update the schema lock."""
    from seamq.registry import generate as write

    folder, module = _paths(manifests, out)
    try:
        changed = write(folder, module)
    except SeamqError as exc:
        exit_with(exc)
    console.print(f"{module}: {'written' if changed else 'unchanged'}; restart consumers to use it")


@app.command()
def check(manifests: Optional[Path] = Manifests, out: Optional[Path] = Out, as_json: bool = JsonOption) -> None:
    """Exit 1 when the generated module is stale or a released version's schema changed."""
    from seamq.registry import check as verify

    folder, module = _paths(manifests, out)
    try:
        problems = verify(folder, module)
    except SeamqError as exc:
        exit_with(exc)
    if as_json:
        print_json({"module": str(module), "manifests": str(folder), "up_to_date": not problems, "problems": problems})
        raise typer.Exit(1 if problems else 0)
    for problem in problems:
        report(SeamqError(ErrorCode.REGISTRY_STALE, problem))
    if problems:
        raise typer.Exit(1)
    console.print(f"{module} is up to date with {folder}")


def asyncapi(
    manifests: Optional[Path] = Manifests,
    topology: Optional[Path] = typer.Option(None, "--topology", help="Topology file (default: SEAMQ_TOPOLOGY_FILE, "
                                                                       "else the shipped one)."),
    output: str = typer.Option("yaml", "--format", help="yaml or json."),
) -> None:
    """Print an AsyncAPI 3.0 document of the events in the manifests: channels, payloads, headers, DLQs."""
    import json
    from importlib.metadata import version

    import yaml

    from seamq.asyncapi import document
    from seamq.cli.common import topology as load_topology
    from seamq.registry import subscriptions

    if output not in ("yaml", "json"):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--format must be yaml or json, not {output!r}"))
    current = settings()
    try:
        doc = document(load_topology(topology, current), subscriptions(manifests or current.registry_manifests),
                       version=version("seamq"), servers=[url.strip() for url in current.nats.url.split(",")])
    except SeamqError as exc:
        exit_with(exc)
    typer.echo(json.dumps(doc, indent=2) if output == "json" else yaml.safe_dump(doc, sort_keys=False, width=100))
