"""`seamq asyncapi`: an AsyncAPI 3.0 document that the official JSON Schema accepts, of what really flows."""

from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest
import yaml

from seamq.asyncapi import document
from seamq.registry import subscriptions
from seamq.topology import load_topology

from helpers import HELPERS, SEAMQ

SPEC = json.loads((HELPERS / "asyncapi" / "asyncapi-3.0.0.json").read_text())

EVENTS = '''
from seamq import EventModel
from pydantic import BaseModel


class Mood(BaseModel):
    name: str
    level: int


class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1):
    vibe_id: str
    moods: list[Mood] = []
'''
MANIFEST = """
context: sea
subscriptions:
  - event: vibe_created
    source: vibespro
    versions:
      1: {handler: "events:on_vibe", model: "events:VibeCreatedV1"}
      2: {handler: "http://127.0.0.1:9/handle", schema: {type: object, required: [n], properties: {n: {type: integer}}}}
"""
PARTITIONED = """
contexts: {sea: {}, vibespro: {}}
consumers:
  sea__from_vibespro: {partitions: 4}
  vibespro__from_sea: {}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "sea.yaml").write_text(MANIFEST)
    (tmp_path / "events.py").write_text(EVENTS + "\n\nasync def on_vibe(envelope, conn):\n    pass\n")
    (tmp_path / "topology.yaml").write_text(PARTITIONED)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refs(node, found=None) -> list[str]:
    found = [] if found is None else found
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            found.append(node["$ref"])
        for value in node.values():
            refs(value, found)
    elif isinstance(node, list):
        for value in node:
            refs(value, found)
    return found


def resolve(doc, ref: str):
    node = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_the_document_is_valid_asyncapi_3_and_every_reference_resolves(project):
    doc = document(load_topology(project / "topology.yaml"), subscriptions(project / "manifests"), version="1.2.3",
                   servers=["nats://app:s3cret@127.0.0.1:4222", "tls://10.0.0.2:4222"])
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(SPEC).iter_errors(doc)]
    assert errors == []
    assert all(resolve(doc, ref) is not None for ref in refs(doc))  # a KeyError fails it
    assert "s3cret" not in json.dumps(doc) and doc["servers"]["nats1"] == {"host": "127.0.0.1:4222",
                                                                           "protocol": "nats"}
    v1 = doc["channels"]["vibespro.vibe_created.v1"]
    assert v1["address"] == "vibespro.event.vibe_created.v1.b{bucket}" and "bucket" in v1["parameters"]
    payload = doc["components"]["messages"]["vibespro.vibe_created.v1"]["payload"]
    assert payload["required"] == ["vibe_id"]  # from the model
    assert resolve(doc, payload["properties"]["moods"]["items"]["$ref"])["required"] == ["name", "level"]
    assert doc["components"]["messages"]["vibespro.vibe_created.v2"]["payload"]["properties"] == \
        {"n": {"type": "integer"}}
    assert {op["action"] for op in doc["operations"].values()} == {"send", "receive"}
    assert "sea__from_vibespro_receives_vibe_created_v2" in doc["operations"]
    assert doc["channels"]["sea__from_vibespro.dlq"]["address"] == "sea.dlq.vibespro.{event}"
    assert "max_deliver" in doc["components"]["messages"]["dead_letter"]["payload"]["properties"]["reason"]["enum"]


def test_a_broken_document_is_refused_by_the_schema():
    """The check has teeth: the vendored schema rejects what AsyncAPI 3.0 does not allow."""
    doc = document(load_topology(), [], version="1")
    doc["channels"]["x"] = {"address": 7}
    assert list(jsonschema.Draft7Validator(SPEC).iter_errors(doc))


def test_the_command_prints_yaml_or_json(project):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env.update(SEAMQ_TOPOLOGY_FILE=str(project / "topology.yaml"))
    out = subprocess.run([*SEAMQ, "asyncapi"], cwd=project, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["asyncapi"] == "3.0.0"
    out = subprocess.run([*SEAMQ, "asyncapi", "--format", "json"], cwd=project, env=env, capture_output=True, text=True)
    assert json.loads(out.stdout)["channels"]
    bad = subprocess.run([*SEAMQ, "asyncapi", "--format", "xml"], cwd=project, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "error[INVALID_CONFIG]" in bad.stderr
