"""Workflow rules without a server: chain, group and batch move on from each job's end, idempotently."""

from __future__ import annotations

import pytest

from seamq.jobs import workflows
from seamq.jobs.model import OjsError, State, utcnow

COMPLETED, DISCARDED = State.COMPLETED, State.DISCARDED


def item(name: str, queue: str = "q") -> dict:
    return {"type": f"t.{name}", "args": [name], "options": {"queue": queue}}


def ended(job: dict, state: str = COMPLETED, result=None) -> dict:
    return {**job, "state": state, "result": result}


def test_chain_runs_one_step_at_a_time_and_passes_results():
    now = utcnow()
    wf, first = workflows.new({"type": "chain", "steps": [item("a"), item("b"), item("c")]}, now)
    assert [j["type"] for j in first] == ["t.a"] and wf["steps_total"] == 3 and wf["steps_completed"] == 0
    wf, started = workflows.job_ended(wf, ended(first[0], result={"n": 1}), now)
    assert [j["type"] for j in started] == ["t.b"] and started[0]["parent_results"] == [{"n": 1}]
    assert started[0]["id"] == wf["_ids"][1]  # chosen at creation: a replayed step creates nothing new
    assert workflows.job_ended(wf, ended(first[0]), now) == (None, [])  # the same end twice: nothing
    wf, started = workflows.job_ended(wf, ended(started[0], result=2), now)
    assert started[0]["parent_results"] == [{"n": 1}, 2]
    wf, started = workflows.job_ended(wf, ended(started[0]), now)
    assert wf["state"] == "completed" and wf["steps_completed"] == 3 and started == []


def test_chain_stops_at_a_step_that_does_not_complete():
    now = utcnow()
    wf, first = workflows.new({"type": "chain", "steps": [item("a"), item("b")]}, now)
    wf, started = workflows.job_ended(wf, ended(first[0], DISCARDED), now)
    assert wf["state"] == "failed" and started == [] and wf["steps_completed"] == 0


@pytest.mark.parametrize("states,outcome,callbacks", [
    ([COMPLETED, COMPLETED], "completed", ["on_success", "on_complete"]),
    ([COMPLETED, DISCARDED], "failed", ["on_failure", "on_complete"]),
])
def test_batch_fires_its_callbacks_once_every_job_has_ended(states, outcome, callbacks):
    now = utcnow()
    body = {"type": "batch", "jobs": [item("a"), item("b")],
            "callbacks": {name: item(name, queue="cb") for name in workflows.CALLBACKS}}
    wf, jobs = workflows.new(body, now)
    assert len(jobs) == 2
    wf, started = workflows.job_ended(wf, ended(jobs[0], states[0], result="r0"), now)
    assert wf["state"] == "running" and started == []
    wf, started = workflows.job_ended(wf, ended(jobs[1], states[1]), now)
    assert wf["state"] == outcome
    assert sorted(j["type"] for j in started) == sorted(f"t.{c}" for c in callbacks)
    assert all(j["parent_results"] == ["r0", None] for j in started)


def test_a_cancelled_workflow_moves_no_more():
    now = utcnow()
    wf, first = workflows.new({"type": "chain", "steps": [item("a"), item("b")]}, now)
    stopped = workflows.cancelled(wf, now)
    assert workflows.job_ended(stopped, ended(first[0]), now) == (None, [])
    with pytest.raises(OjsError):
        workflows.cancelled(stopped, now)


@pytest.mark.parametrize("body", [
    {"type": "dag", "steps": [item("a")]}, {"type": "chain", "steps": []}, {"type": "group"},
    {"type": "group", "jobs": [item("a"), {"args": []}]}, {"type": "chain", "steps": [item("a")],
                                                           "callbacks": {"on_success": item("s")}},
    [], "x",
])
def test_invalid_workflows_are_refused_whole(body):
    with pytest.raises(OjsError) as refused:
        workflows.new(body, utcnow())
    assert 400 <= refused.value.status < 500
