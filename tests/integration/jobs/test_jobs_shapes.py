"""Unit tier: the shapes the SDKs send, read by the model without a server (docs/jobs.md, "SDK compatibility")."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from seamq.jobs import attempts, cron, model, schemas, unique, workflows
from seamq.jobs.ext import progress_value
from seamq.jobs.model import OjsError

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("active_jobs, ids, expected", [
    (["a", "b"], None, ["a", "b"]),  # the spec, the Python SDK
    (2, ["a", "b"], ["a", "b"]),  # the JS SDK
    (None, None, []), (0, [], []),
])
def test_a_heartbeat_names_its_jobs_as_either_sdk_sends_them(active_jobs, ids, expected):
    assert attempts.heartbeat_ids(active_jobs, ids) == expected


@pytest.mark.parametrize("active_jobs, ids", [(1, None), (3, ["a"]), ("a", None), ([1], None), ([""], None)])
def test_a_heartbeat_that_would_extend_nothing_it_means_is_refused(active_jobs, ids):
    with pytest.raises(OjsError) as refused:
        attempts.heartbeat_ids(active_jobs, ids)
    assert refused.value.status == 400


@pytest.mark.parametrize("details, expected", [
    ({"traceback": "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad\n"}, "ValueError"),
    ({"traceback": "Traceback ...\nmy.mod.Boom\n"}, "my.mod.Boom"),
    ({"stack": "BadInput: never again\n    at handler (file.js:1:1)"}, "BadInput"),
    ({"traceback": "\n\n"}, "InternalServerError"),
])
def test_the_error_type_is_read_from_the_trace_the_sdk_workers_send(details, expected):
    assert attempts.error_type({"code": "handler_error", "message": "m", "details": details}) == expected


def test_unique_key_is_the_python_sdks_name_for_keys():
    record = model.new_record({"type": "a.b", "args": [1], "options": {"queue": "q1", "unique": {
        "key": ["type", "queue"]}}}, NOW)
    other = model.new_record({"type": "a.b", "args": [2], "options": {"queue": "q1", "unique": {
        "keys": ["type", "queue"]}}}, NOW)
    assert unique.fingerprint(record) == unique.fingerprint(other)
    with pytest.raises(OjsError):
        model.validate_unique({"key": ["type"], "keys": ["args"]})


def step(step_id, depends=(), callback=None):
    options = {"callback_type": callback} if callback else None
    return {"id": step_id, "type": "s.t", "args": [step_id], "depends_on": list(depends),
            **({"options": options} if options else {})}


@pytest.mark.parametrize("steps, kind", [
    ([step("a"), step("b", ["a"]), step("c", ["b"])], "chain"),
    ([step("a"), step("b")], "group"),
    ([step("a"), step("b"), step("on_success", ["a", "b"], "on_success")], "batch"),
])
def test_the_python_sdks_steps_are_read_as_the_shape_they_draw(steps, kind):
    shaped, ids = workflows.from_steps({"name": "w", "steps": steps})
    assert shaped["type"] == kind and ids == [s["id"] for s in steps]
    record, first = workflows.new({"name": "w", "steps": steps}, NOW)
    assert record["_step_ids"] == ids and first


@pytest.mark.parametrize("steps", [
    [step("a"), step("b", ["a"]), step("c", ["a"])],  # a fan-out: no chain, group or batch
    [step("a"), step("a")],  # the same id twice
    [step("a", ["zz"])],  # a dependency that is no step
    [step("a"), step("cb", ["a"], "on_whatever")],
])
def test_another_graph_is_refused_not_guessed(steps):
    with pytest.raises(OjsError) as refused:
        workflows.new({"name": "w", "steps": steps}, NOW)
    assert refused.value.status == 400


def test_a_workflow_shows_its_steps_and_counts_to_both_sdks():
    record, first = workflows.new({"name": "w", "steps": [step("a"), step("b", ["a"])]}, NOW)
    shown = workflows.public(record, {first[0]["id"]: "completed"})
    assert [(s["id"], s["state"]) for s in shown["steps"]] == [("a", "completed"), ("b", "pending")]
    assert shown["metadata"]["job_count"] == 2 and shown["metadata"]["completed_count"] == 1


def test_cron_takes_the_sdks_shape_and_shows_both():
    record = cron.new({"name": "n", "cron": "0 3 * * *", "type": "r.x", "args": [1]}, NOW)
    assert record["expression"] == "0 3 * * *" and record["job_template"] == {"type": "r.x", "args": [1]}
    shown = cron.public(record)
    assert (shown["cron"], shown["type"], shown["args"], shown["status"]) == ("0 3 * * *", "r.x", [1], "active")
    for body in ({"name": "n", "cron": "0 3 * * *", "expression": "0 4 * * *", "type": "r.x"},
                 {"name": "n", "cron": "0 3 * * *", "type": "r.x", "job_template": {"type": "r.x", "args": []}},
                 {"name": "n", "cron": "0 3 * * *"}):
        with pytest.raises(OjsError):
            cron.new(body, NOW)


def test_schema_versions_order_and_args_are_checked():
    assert sorted(["1.10.0", "1.9.0", "2"], key=schemas.order) == ["1.9.0", "1.10.0", "2"]
    assert schemas.version_of("3") == 3 and schemas.version_of("1.0.0") == "1.0.0"
    record = schemas.new("e.mail", 1, {"schema": {"type": "array", "items": [{"type": "string"}]}}, NOW)
    schemas.check_args(record, ["a@b.c"])
    with pytest.raises(OjsError) as wrong:
        schemas.check_args(record, [42])
    assert "args[0]" in wrong.value.message
    with pytest.raises(OjsError):
        schemas.new("e.mail", 1, {"schema": {"type": 12}}, NOW)


@pytest.mark.parametrize("body, expected", [
    ({"progress": 0.5}, 0.5), ({"percentage": 40}, 0.4), ({"progress": 1.5}, 1.0), ({"percentage": -3}, 0.0),
])
def test_progress_is_a_fraction_from_either_scale_and_clamped(body, expected):
    assert progress_value(body)[0] == pytest.approx(expected)


@pytest.mark.parametrize("body", [{}, {"progress": "x"}, {"progress": 0.5, "percentage": 10}, {"progress": True}])
def test_progress_that_says_nothing_or_disagrees_is_refused(body):
    with pytest.raises(OjsError):
        progress_value(body)
