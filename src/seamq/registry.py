"""The handler registry (REQ-060): which handler serves each (source, event type, version).

Manifests (YAML, one per consuming context) list the subscribed events, a
handler per version (a Python import path, run in-process inside the inbox
transaction, or an HTTP URL, SDS-047 §12), options, and the payload's JSON
Schema, written out or taken from a typed event model (`model:`, seamq.typed). `generate()` turns them into a Python module with stable
ordering: byte-identical on every run, whatever the file order. The consumer
loads only that module, once, at start: a manifest change needs regenerate +
restart. A lock file beside the manifests keeps each released version's
schema; a change to `.v1` that is not compatible (seamq.compat) is refused:
a breaking change needs `.v2` (REQ-057).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from seamq.compat import breaking_changes
from seamq.model import ErrorCode, EventSubject, SeamqError, is_name, validate_token

LOCK_FILE = "registry.lock.json"
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Route:
    event_type: str
    version: int
    handler: str | Callable  # "pkg.module:function", "http://host/handle", or the function itself
    source: str | None = None  # the producing context; None: any
    timeout: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    schema: str | None = None  # JSON Schema of the payload, as canonical JSON text
    # The consuming context whose manifest declared it; None: any. Two contexts may subscribe to one
    # event in one registry, and each consumer runs only its own context's handler.
    context: str | None = None

    def __post_init__(self) -> None:
        validate_token(self.event_type, "event type")


@dataclass(frozen=True)
class Registry:
    routes: tuple[Route, ...] = ()
    default: str | Callable | None = None  # serves events without a route (e.g. one /handle per context)


def import_object(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"handler {path!r} must be 'package.module:name'")
    if os.getcwd() not in sys.path:
        # The user's own modules (registry_generated.py, handlers) from where they run `seamq`, as
        # `python -m` would find them; appended, so a file there cannot shadow an installed package.
        sys.path.append(os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"cannot import handler {path!r}: {exc}") from None


def load_registry(path: str) -> Registry:
    registry = import_object(path)
    if not isinstance(registry, Registry):
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"{path!r} is a {type(registry).__name__}, not a Registry")
    return registry


# -- manifests -> generated module ---------------------------------------------

def _manifest_error(source: str, key: str, reason: str) -> SeamqError:
    return SeamqError(ErrorCode.INVALID_MANIFEST, f"{source}: {key}: {reason}")


def canonical_schema(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def read_manifests(directory: Path) -> list[Route]:
    """Every route of every `*.yaml` manifest in `directory`, validated, in a stable order."""
    return [route for _, route in subscriptions(directory)]


def subscriptions(directory: Path) -> list[tuple[str, Route]]:
    """(the consuming context, its route) for every route of the manifests, in a stable order."""
    import yaml  # here, not at the top: producers import seamq without the worker extra
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    files = sorted(Path(directory).glob("*.yaml"))
    if not files:
        raise SeamqError(ErrorCode.INVALID_MANIFEST, f"{directory}: no *.yaml manifests found")
    routes: dict[tuple, Route] = {}
    for path in files:
        source = str(path)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise SeamqError(ErrorCode.INVALID_MANIFEST, f"{source}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("subscriptions"), list):
            raise _manifest_error(source, "subscriptions", "a list of subscribed events is required")
        context = data.get("context")
        if not is_name(context):
            raise _manifest_error(source, "context", "the consuming context, lowercase snake_case, is required")
        for i, sub in enumerate(data["subscriptions"]):
            key = f"subscriptions[{i}]"
            if not isinstance(sub, dict):
                raise _manifest_error(source, key, "must be a mapping")
            unknown = set(sub) - {"event", "source", "versions"}
            if unknown:
                raise _manifest_error(source, f"{key}.{sorted(unknown)[0]}", "unknown key")
            event, producer = sub.get("event"), sub.get("source")
            for name, value in (("event", event), ("source", producer)):
                if not is_name(value):
                    raise _manifest_error(source, f"{key}.{name}", "lowercase snake_case name required")
            versions = sub.get("versions")
            if not isinstance(versions, dict) or not versions:
                raise _manifest_error(source, f"{key}.versions", "a mapping of version number -> handler is required")
            for version, spec in versions.items():
                vkey = f"{key}.versions.{version}"
                if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                    raise _manifest_error(source, vkey, "versions are integers >= 1")
                if not isinstance(spec, dict):
                    raise _manifest_error(source, vkey, "must be a mapping with a handler")
                unknown = set(spec) - {"handler", "schema", "model", "timeout", "options"}
                if unknown:
                    raise _manifest_error(source, f"{vkey}.{sorted(unknown)[0]}", "unknown key")
                handler = spec.get("handler")
                if not isinstance(handler, str) or not (
                        handler.startswith(("http://", "https://")) or _IMPORT_PATH.match(handler)):
                    raise _manifest_error(source, f"{vkey}.handler", "an import path 'pkg.module:function' "
                                                                     "or an http(s):// URL is required")
                schema = spec.get("schema")
                if "model" in spec:
                    if schema is not None:
                        raise _manifest_error(source, f"{vkey}.model", "give a schema or a model, not both")
                    schema = _model_schema(source, f"{vkey}.model", spec["model"], producer, event, version)
                if schema is not None:
                    try:
                        Draft202012Validator.check_schema(schema)
                    except SchemaError as exc:
                        raise _manifest_error(source, f"{vkey}.schema",
                                              f"not a valid JSON Schema: {exc.message}") from None
                timeout = spec.get("timeout")
                if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
                    raise _manifest_error(source, f"{vkey}.timeout", "seconds > 0")
                options = spec.get("options") or {}
                if not isinstance(options, dict):
                    raise _manifest_error(source, f"{vkey}.options", "must be a mapping")
                ident = (context, producer, event, version)
                if ident in routes:
                    raise _manifest_error(source, vkey, f"{producer}.{event}.v{version} is declared twice for {context}")
                routes[ident] = Route(
                    event_type=event, version=version, handler=handler, source=producer,
                    timeout=float(timeout) if timeout else None, options=options,
                    schema=canonical_schema(schema) if schema is not None else None, context=context,
                )
    return [(k[0], routes[k]) for k in sorted(routes)]


def _model_schema(source: str, key: str, path: Any, producer: str, event: str, version: int) -> dict:
    """The JSON Schema of a typed event model named in a manifest, which must be that event's."""
    from seamq.typed import EventModel

    if not isinstance(path, str) or not _IMPORT_PATH.match(path):
        raise _manifest_error(source, key, "an import path 'pkg.module:Model' is required")
    try:
        model = import_object(path)
    except SeamqError as exc:
        raise _manifest_error(source, key, exc.message) from None
    if not (isinstance(model, type) and issubclass(model, EventModel)):
        raise _manifest_error(source, key, f"{path} is not a seamq.typed.EventModel")
    if model.seamq_subject != EventSubject(producer, event, version):
        raise _manifest_error(source, key, f"{path} is {model.seamq_subject}, not {producer}.event.{event}.v{version}")
    return model.json_schema()


def _route_key(route: Route) -> str:
    return f"{route.source}.{route.event_type}.v{route.version}"


def render_module(routes: list[Route], contexts: list[str]) -> str:
    """The generated module's text: deterministic, so regenerating is byte-identical."""
    lines = [
        '"""Handler registry generated by `seamq registry generate`. Do not edit: edit the manifests."""',
        "",
        "from seamq.registry import Registry, Route",
        "",
        f"CONTEXTS = {tuple(contexts)!r}",
        "",
        "REGISTRY = Registry(routes=(",
    ]
    for r in routes:
        lines.append(
            f"    Route(event_type={r.event_type!r}, version={r.version}, handler={r.handler!r}, "
            f"source={r.source!r}, timeout={r.timeout!r}, options={json.loads(json.dumps(r.options, sort_keys=True))!r},"
            f" schema={r.schema!r}, context={r.context!r}),"
        )
    lines += ["))", ""]
    return "\n".join(lines)


def manifest_contexts(directory: Path) -> list[str]:
    import yaml

    return sorted({yaml.safe_load(p.read_text()).get("context") for p in Path(directory).glob("*.yaml")})


def check_lock(directory: Path, routes: list[Route]) -> tuple[dict[str, Any], list[str]]:
    """(the lock with new versions added, breaking changes to versions already locked).

    The lock keeps each version's schema as first released; a compatible change (a new optional
    field) is allowed and the lock keeps the old schema, so a later change is judged against it
    too. A lock written by seamq 0.1 holds a hash instead: unchanged schemas are upgraded to the
    schema itself, changed ones cannot be judged and are refused."""
    path = Path(directory) / LOCK_FILE
    lock: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    problems, updated = [], dict(lock)
    for route in routes:
        key = _route_key(route)
        schema = json.loads(route.schema) if route.schema else None
        if key not in lock:
            updated[key] = schema
            continue
        locked = lock[key]
        if isinstance(locked, str) and len(locked) == 64:  # seamq 0.1: a sha256 of the canonical schema
            if locked == hashlib.sha256((route.schema or "null").encode()).hexdigest():
                updated[key] = schema
            else:
                problems.append(f"{key}: its schema changed since it was locked (the lock holds only a hash, "
                                f"so compatibility cannot be judged); a breaking change requires "
                                f".v{route.version + 1}")
            continue
        changes = breaking_changes(locked, schema)
        if changes:
            problems.append(f"{key}: {'; '.join(changes)}; a breaking change requires .v{route.version + 1}")
    return dict(sorted(updated.items())), problems


def generate(directory: Path, out: Path) -> bool:
    """Write the module and the lock; True when the module changed. Refuses breaking changes."""
    routes = read_manifests(directory)
    lock, problems = check_lock(directory, routes)
    if problems:
        raise SeamqError(ErrorCode.BREAKING_CHANGE, "; ".join(problems))
    text = render_module(routes, manifest_contexts(directory))
    changed = not out.exists() or out.read_text() != text
    if changed:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    (Path(directory) / LOCK_FILE).write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return changed


def check(directory: Path, out: Path) -> list[str]:
    """Problems that should fail CI: a stale module, or a changed schema of a locked version."""
    routes = read_manifests(directory)
    lock_path = Path(directory) / LOCK_FILE
    _, problems = check_lock(directory, routes)
    if not lock_path.exists():
        problems.append(f"{lock_path} is missing: run `seamq registry generate` and commit it")
    text = render_module(routes, manifest_contexts(directory))
    if not out.exists():
        problems.append(f"{out} is missing: run `seamq registry generate`")
    elif out.read_text() != text:
        problems.append(f"{out} is stale: the manifests changed; run `seamq registry generate` and restart consumers")
    return problems
