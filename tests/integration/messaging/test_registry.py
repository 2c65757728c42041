"""Handler registry generated from manifests (REQ-060) and versioned events (REQ-057)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psycopg
import pytest

from helpers import FAST_TOPOLOGY, SEAMQ, TESTS
from helpers import fetch_all, scalar, wait_for
from helpers.consumer import CONSUMER, inbox, publish, settled, vibe

SCHEMA_V1 = """
        schema:
          type: object
          required: [n]
          properties: {n: {type: integer}}"""
MANIFEST = f"""
context: sea
subscriptions:
  - event: vibe_created
    source: vibespro
    versions:
      1:
        handler: helpers.inprocess_handlers:record_v1{SCHEMA_V1}
      2:
        handler: helpers.inprocess_handlers:record_v2
        timeout: 5
        schema: {{type: object, required: [n, mood], properties: {{mood: {{type: string}}}}}}
"""
OTHER = """
context: vibespro
subscriptions:
  - event: order_placed
    source: sea
    versions:
      1: {handler: "http://127.0.0.1:9/handle"}
"""


def cli(*args, cwd, env=None):
    return subprocess.run([*SEAMQ, "registry", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def project(tmp_path):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "sea.yaml").write_text(MANIFEST)
    (tmp_path / "manifests" / "vibespro.yaml").write_text(OTHER)
    return tmp_path


def test_generate_is_byte_identical_and_independent_of_file_order(project, tmp_path_factory):
    assert cli("generate", cwd=project).returncode == 0
    first = (project / "registry_generated.py").read_bytes()
    assert cli("generate", cwd=project).returncode == 0
    assert (project / "registry_generated.py").read_bytes() == first
    # The same manifests under other file names (so listed in another order): same module.
    other = tmp_path_factory.mktemp("other")
    (other / "manifests").mkdir()
    (other / "manifests" / "a.yaml").write_text(OTHER)
    (other / "manifests" / "b.yaml").write_text(MANIFEST)
    assert cli("generate", cwd=other).returncode == 0
    assert (other / "registry_generated.py").read_bytes() == first
    assert cli("check", cwd=project).returncode == 0
    assert b"vibe_created" in first and b"record_v2" in first


def test_edited_manifest_makes_check_fail(project):
    cli("generate", cwd=project)
    manifest = project / "manifests" / "sea.yaml"
    manifest.write_text(MANIFEST.replace("timeout: 5", "timeout: 7"))
    result = cli("check", cwd=project)
    assert result.returncode == 1 and "stale" in result.stderr
    assert cli("generate", cwd=project).returncode == 0 and cli("check", cwd=project).returncode == 0


def test_changed_v1_schema_is_refused(project):
    cli("generate", cwd=project)
    manifest = project / "manifests" / "sea.yaml"
    manifest.write_text(MANIFEST.replace("properties: {n: {type: integer}}", "properties: {n: {type: string}}"))
    result = cli("generate", cwd=project)
    assert result.returncode == 2 and "BREAKING_CHANGE" in result.stderr
    assert "vibespro.vibe_created.v1" in result.stderr and "requires .v2" in result.stderr
    assert cli("check", cwd=project).returncode == 1
    # Adding a new version is fine.
    manifest.write_text(MANIFEST + "      3:\n        handler: helpers.inprocess_handlers:record_v2\n")
    assert cli("generate", cwd=project).returncode == 0


@pytest.mark.parametrize("text,key", [
    ("context: sea\nsubscriptions:\n  - {event: Bad-Name, source: x, versions: {1: {handler: 'a:b'}}}\n",
     "subscriptions[0].event"),
    ("context: sea\nsubscriptions:\n  - {event: e, source: x, versions: {0: {handler: 'a:b'}}}\n",
     "subscriptions[0].versions.0"),
    ("context: sea\nsubscriptions:\n  - {event: e, source: x, versions: {1: {handler: 'not a path'}}}\n",
     "subscriptions[0].versions.1.handler"),
    ("context: sea\nsubscriptions:\n  - {event: e, source: x, versions: {1: {handler: 'a:b', schema: {type: 7}}}}\n",
     "subscriptions[0].versions.1.schema"),
    ("subscriptions: []\n", "context"),
])
def test_bad_manifests_name_file_and_key(tmp_path, text, key):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "m.yaml").write_text(text)
    result = cli("generate", cwd=tmp_path)
    assert result.returncode == 2 and "INVALID_MANIFEST" in result.stderr
    assert f": {key}:" in " ".join(result.stderr.split()) and "m.yaml" in result.stderr


async def test_v1_and_v2_run_side_by_side_and_payloads_are_validated(project, dsn, nats_server, nc, topo,
                                                                       service_env):
    assert cli("generate", cwd=project).returncode == 0
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE handled (message_id uuid, version int, handler text)")
    (project / "topology.yaml").write_text(FAST_TOPOLOGY)
    js = nc.jetstream()
    v1, v2 = vibe("a", 1), vibe("b", 2, version=2, mood="calm")
    bad_v1 = vibe("c", "one")  # n must be an integer
    bad_v2 = vibe("d", 3, version=2)  # mood missing
    await publish(js, [v1, v2, bad_v1, bad_v2])
    env = dict(service_env, PYTHONPATH=f"{project}:{TESTS}",
               SEAMQ_CONSUMER__REGISTRY="registry_generated:REGISTRY",
               SEAMQ_TOPOLOGY_FILE=str(project / "topology.yaml"))
    worker = subprocess.Popen([*SEAMQ, "consume", "--consumer", CONSUMER], env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_for(lambda: settled(js), what="all settled")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    rows = dict(fetch_all(dsn, "SELECT message_id, handler FROM handled"))
    assert rows == {v1.id: "v1", v2.id: "v2"}
    for bad, where in ((bad_v1, "n"), (bad_v2, "payload")):
        meta = inbox(dsn, bad.id)["dlq_metadata"]
        assert meta["reason"] == "schema_mismatch" and meta["detail"].startswith(where)
    assert scalar(dsn, "SELECT count(*) FROM handled") == 2


def test_compatible_change_to_v1_passes_and_a_breaking_one_names_the_field(project):
    assert cli("generate", cwd=project).returncode == 0
    lock = json.loads((project / "manifests" / "registry.lock.json").read_text())
    assert lock["vibespro.vibe_created.v1"]["properties"] == {"n": {"type": "integer"}}  # the schema, not a hash
    manifest = project / "manifests" / "sea.yaml"
    optional = MANIFEST.replace("properties: {n: {type: integer}}",
                                "properties: {n: {type: integer}, mood: {type: string}}")
    manifest.write_text(optional)
    assert cli("generate", cwd=project).returncode == 0 and cli("check", cwd=project).returncode == 0
    manifest.write_text(optional.replace("required: [n]", "required: [n, mood]"))
    result = cli("generate", cwd=project)
    assert result.returncode == 2 and "BREAKING_CHANGE" in result.stderr
    # Judged against the schema first released, which had no mood at all.
    assert "vibespro.vibe_created.v1: payload.mood: added as required" in " ".join(result.stderr.split())


def test_a_lock_of_hashes_is_upgraded_when_unchanged(project):
    import hashlib

    from seamq.registry import canonical_schema

    schema = canonical_schema({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})
    (project / "manifests" / "registry.lock.json").write_text(json.dumps({
        "vibespro.vibe_created.v1": hashlib.sha256(schema.encode()).hexdigest()}))
    assert cli("generate", cwd=project).returncode == 0
    lock = json.loads((project / "manifests" / "registry.lock.json").read_text())
    assert lock["vibespro.vibe_created.v1"] == json.loads(schema)


MODELS = '''
from seamq import EventModel


class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1):
    n: int
    mood: str | None = None
'''


def test_a_manifest_takes_its_schema_from_a_typed_model(project):
    (project / "events.py").write_text(MODELS)
    manifest = project / "manifests" / "sea.yaml"
    manifest.write_text(MANIFEST.replace(SCHEMA_V1, "\n        model: events:VibeCreatedV1"))
    result = cli("generate", cwd=project)
    assert result.returncode == 0, result.stderr
    namespace: dict = {}
    exec((project / "registry_generated.py").read_text(), namespace)
    [v1] = [r for r in namespace["REGISTRY"].routes if (r.event_type, r.version) == ("vibe_created", 1)]
    assert json.loads(v1.schema)["properties"]["mood"] == {"anyOf": [{"type": "string"}, {"type": "null"}],
                                                            "default": None, "title": "Mood"}
    v2_schema = "        schema: {type: object, required: [n, mood], properties: {mood: {type: string}}}\n"
    both = MANIFEST.replace(SCHEMA_V1, "\n        model: events:VibeCreatedV1").replace(
        v2_schema, v2_schema + "        model: events:VibeCreatedV1\n")
    manifest.write_text(both)
    result = cli("generate", cwd=project)
    assert result.returncode == 2 and "versions.2.model: give a schema or a model, not both" in result.stderr
    manifest.write_text(both.replace(v2_schema, ""))
    result = cli("generate", cwd=project)
    assert result.returncode == 2 and "INVALID_MANIFEST" in result.stderr
    assert "is vibespro.event.vibe_created.v1, not vibespro.event.vibe_created.v2" in " ".join(result.stderr.split())


def test_two_contexts_on_one_event_each_consumer_runs_its_own_contexts_handler(tmp_path):
    """Billing and warehouse both subscribe to shop's order_placed v1. The generated registry had no
    context on its routes, and `seamq consume --consumer billing__from_shop` ran warehouse's handler."""
    import importlib.util

    from seamq.model import SeamqError
    from seamq.registry import generate
    from seamq.wiring import build_handlers

    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for context in ("billing", "warehouse"):
        (manifests / f"{context}.yaml").write_text(
            f"context: {context}\nsubscriptions:\n  - event: order_placed\n    source: shop\n"
            f"    versions:\n      1: {{handler: 'json:dumps'}}\n".replace("json:dumps", f"{context}_mod:handle"))
    out = tmp_path / "registry_generated.py"
    generate(manifests, out)
    spec = importlib.util.spec_from_file_location("registry_two", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for context in ("billing", "warehouse"):
        (tmp_path / f"{context}_mod.py").write_text(f"async def handle(envelope, tx):\n    return {context!r}\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        for context in ("billing", "warehouse"):
            handler = build_handlers(module.REGISTRY, source="shop", target=context)("order_placed", 1)
            assert handler.fn.__module__ == f"{context}_mod", f"{context} got {handler.fn.__module__}'s handler"
        with pytest.raises(SeamqError, match="handlers of billing and warehouse .* name the consuming context"):
            build_handlers(module.REGISTRY, source="shop")
    finally:
        sys.path.remove(str(tmp_path))
