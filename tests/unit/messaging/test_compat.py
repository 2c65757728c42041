"""Schema evolution of a released version: compatible changes pass, breaking ones name the field."""

from __future__ import annotations

import pytest

from seamq.compat import breaking_changes
from seamq.typed import EventModel

V1 = {"type": "object", "required": ["id", "n"],
      "properties": {"id": {"type": "string"}, "n": {"type": "integer"},
                     "tags": {"type": "array", "items": {"type": "string"}},
                     "owner": {"$ref": "#/$defs/Owner"}},
      "$defs": {"Owner": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}


def changed(**edits):
    import copy

    schema = copy.deepcopy(V1)
    for path, value in edits.items():
        *parents, last = path.split("__")
        target = schema
        for p in parents:
            target = target[p]
        if value is None:
            del target[last]
        else:
            target[last] = value
    return schema


@pytest.mark.parametrize("new", [
    V1,
    changed(properties__mood={"type": "string"}),  # a new optional field
    changed(title="Vibe created", properties__n={"type": "integer", "description": "how many"}),
    changed(**{"$defs__Owner__properties__email": {"type": "string"}}),  # optional, nested
])
def test_compatible_changes_pass(new):
    assert breaking_changes(V1, new) == []


@pytest.mark.parametrize("new,problem", [
    (changed(properties__n=None, required=["id"]), "payload.n: removed"),
    (changed(properties__n={"type": "string"}), "payload.n: type changed from 'integer' to 'string'"),
    (changed(required=["id", "n", "tags"]), "payload.tags: made required"),
    (changed(required=["id"]), "payload.n: no longer required"),
    (changed(properties__mood={"type": "string"}, required=["id", "n", "mood"]), "payload.mood: added as required"),
    (changed(properties__tags={"type": "array", "items": {"type": "integer"}}),
     "payload.tags[]: type changed from 'string' to 'integer'"),
    (changed(**{"$defs__Owner__properties__name": {"type": "integer"}}), "payload.owner.name: type changed"),
    (changed(**{"$defs__Owner__required": ["name", "email"], "$defs__Owner__properties__email": {"type": "string"}}),
     "payload.owner.email: added as required"),
    (changed(properties__n={"type": "integer", "maximum": 10}), "payload.n: maximum changed from None to 10"),
])
def test_breaking_changes_name_the_field(new, problem):
    problems = breaking_changes(V1, new)
    assert any(p.startswith(problem) for p in problems), problems


def test_a_recursive_schema_is_compared_without_end():
    tree = {"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}}
    assert breaking_changes(tree, tree) == []


def test_models_compatible_as_their_schemas_say():
    class A(EventModel, context="vibespro", name="x", version=1):
        a: int

    class AddOptional(EventModel, context="vibespro", name="x", version=1):
        a: int
        b: str | None = None

    class Retyped(EventModel, context="vibespro", name="x", version=1):
        a: str

    assert breaking_changes(A.json_schema(), AddOptional.json_schema()) == []
    assert any(p.startswith("payload.a: type changed") for p in breaking_changes(A.json_schema(), Retyped.json_schema()))
