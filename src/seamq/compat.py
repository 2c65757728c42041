"""Whether a released event version's new payload schema is compatible with its old one (REQ-057).

A released `.v1` has producers and consumers in the field: events written
under the old schema will still be read, and consumers built on it will read
new ones. So the only change allowed is one that both sides survive: a new
optional field (old events lack it, old consumers ignore it), or words
(title, description, examples). Anything else, a field removed, retyped, made
required, a new required field, a narrower enum or format, is breaking and
needs `.v2`. Each problem names the field. No I/O here; the registry's lock
calls it (seamq.registry.check_lock).
"""

from __future__ import annotations

from typing import Any

# Words about the schema, not rules for the payload: changing them breaks no one.
_WORDS = frozenset({"title", "description", "examples", "$comment", "default", "deprecated"})


def breaking_changes(old: Any, new: Any) -> list[str]:
    """Why `new` cannot replace `old` under the same version; empty when it can."""
    problems: list[str] = []
    _compare(old, new, "payload", old, new, problems, set())
    return problems


def _resolve(schema: Any, root: Any, seen: frozenset[str] = frozenset()) -> Any:
    """Follow local `$ref`s (`#/$defs/Name`, as pydantic writes them)."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/"):
        ref = schema["$ref"]
        if ref in seen:
            return schema
        seen = seen | {ref}
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            return schema
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest}
    return schema


def _compare(old: Any, new: Any, where: str, old_root: Any, new_root: Any, problems: list[str],
             visiting: set[tuple[int, int]]) -> None:
    old, new = _resolve(old, old_root), _resolve(new, new_root)
    key = (id(old), id(new))
    if key in visiting:  # a recursive schema: this pair is being compared further up
        return
    visiting.add(key)
    if not isinstance(old, dict) or not isinstance(new, dict):
        if old != new:
            problems.append(f"{where}: its schema changed from {_short(old)} to {_short(new)}")
        return
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
    for name in old_props:
        if name not in new_props:
            problems.append(f"{where}.{name}: removed")
        else:
            _compare(old_props[name], new_props[name], f"{where}.{name}", old_root, new_root, problems, visiting)
    for name in sorted(set(new_props) - set(old_props)):
        if name in new_required:
            problems.append(f"{where}.{name}: added as required (events written before lack it)")
    for name in sorted(old_required - new_required):
        problems.append(f"{where}.{name}: no longer required (consumers rely on it)")
    for name in sorted(new_required - old_required):
        if name in old_props:
            problems.append(f"{where}.{name}: made required (events written before may lack it)")
    for rule in sorted((set(old) | set(new)) - _WORDS - {"properties", "required", "$defs", "definitions"}):
        a, b = old.get(rule), new.get(rule)
        if rule in ("items", "additionalProperties", "not") and isinstance(a, dict) and isinstance(b, dict):
            _compare(a, b, f"{where}[]" if rule == "items" else f"{where}.<{rule}>", old_root, new_root,
                     problems, visiting)
        elif rule in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(a, list) and isinstance(b, list) \
                and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                _compare(x, y, f"{where}.<{rule}[{i}]>", old_root, new_root, problems, visiting)
        elif _plain(a, old_root) != _plain(b, new_root):
            problems.append(f"{where}: {rule} changed from {_short(a)} to {_short(b)}")


def _plain(value: Any, root: Any, seen: frozenset[str] = frozenset()) -> Any:
    """A rule's value with `$ref`s resolved (once per chain) and words left out, compared by equality."""
    if isinstance(value, dict) and isinstance(value.get("$ref"), str):
        if value["$ref"] in seen:
            return {"$ref": value["$ref"]}
        seen = seen | {value["$ref"]}
        value = _resolve(value, root)
    if isinstance(value, dict):
        return {k: _plain(v, root, seen) for k, v in value.items() if k not in _WORDS}
    if isinstance(value, list):
        return [_plain(v, root, seen) for v in value]
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
