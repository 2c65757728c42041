"""Workflows (chain, group, batch): what a workflow is and how a job's end moves it on. No I/O.

A workflow record holds every item's push body and the job id each will get,
chosen when the workflow is created. Moving a workflow on is then a pure
function of (workflow, finished job) that is idempotent: the engine stores the
job's end, the workflow's new state and the jobs it starts in one atomic batch,
and a job that already exists is never created twice.

- chain: one step at a time; step i+1 gets `parent_results` = the results of
  steps 0..i. A step that ends other than completed fails the chain.
- group: every job at once; completed when all complete, failed when all have
  ended and one did not complete.
- batch: a group with callbacks once every job has ended: `on_complete`
  always, `on_success` if all completed, `on_failure` otherwise.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from seamq.jobs import model
from seamq.jobs.model import OjsError, State, invalid, iso

KINDS = ("chain", "group", "batch")
CALLBACKS = ("on_success", "on_failure", "on_complete")
RUNNING, WF_COMPLETED, FAILED, CANCELLED = "running", "completed", "failed", "cancelled"
MAX_ITEMS = model.MAX_BATCH - 4  # with the record, the callbacks and a count per queue: one atomic batch


def _queue_of(item: Any) -> str:
    """The queue a step names, as far as counting batch records goes (a wrong one is refused later)."""
    options = item.get("options") if isinstance(item, dict) else None
    queue = options.get("queue", "default") if isinstance(options, dict) else "default"
    return queue if isinstance(queue, str) else ""


def key(workflow_id: str) -> str:
    return f"wf.{workflow_id}"


def from_steps(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The Python SDK's form, `{name, steps: [{id, type, args, depends_on, options}]}` with no
    workflow `type`, as the chain, group or batch its dependencies describe, and the step ids.
    Any other graph is refused: seamq runs those three shapes and would rather say so than guess."""
    steps = body.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise invalid("a workflow needs a type (chain, group, batch), or steps with ids and depends_on")
    ids = [s.get("id") for s in steps]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) < len(ids):
        raise invalid("each step needs an id of its own")
    depends = [s.get("depends_on") or [] for s in steps]
    if not all(isinstance(d, list) and set(d) <= set(ids) for d in depends):
        raise invalid("depends_on must list ids of other steps")
    callback = [(s.get("options") or {}).get("callback_type") for s in steps]
    jobs = [i for i, c in enumerate(callback) if c is None]
    job_ids = {ids[i] for i in jobs}

    def item(index: int) -> dict[str, Any]:
        step = steps[index]
        options = {k: v for k, v in (step.get("options") or {}).items() if k != "callback_type"}
        return {k: v for k, v in {"type": step.get("type"), "args": step.get("args", []),
                                  "meta": step.get("meta"), "options": options or None}.items() if v is not None}

    shape = {"name": body.get("name")}
    if any(c is not None for c in callback):
        if set(callback) - {None, *CALLBACKS} or any(depends[i] for i in jobs) or any(
                set(depends[i]) != job_ids for i, c in enumerate(callback) if c is not None):
            raise invalid("a batch's callbacks (options.callback_type on_complete, on_success, on_failure) "
                          "must each depend on every job of the batch, and the jobs on nothing")
        named = [c for c in callback if c is not None]
        if len(set(named)) < len(named):
            raise invalid("a batch has at most one callback of each kind")
        return {**shape, "type": "batch", "jobs": [item(i) for i in jobs],
                "callbacks": {c: item(i) for i, c in enumerate(callback) if c is not None}}, ids
    if not any(depends):
        return {**shape, "type": "group", "jobs": [item(i) for i in range(len(steps))]}, ids
    if depends == [[], *([ids[i]] for i in range(len(ids) - 1))]:
        return {**shape, "type": "chain", "steps": [item(i) for i in range(len(steps))]}, ids
    raise invalid("these dependencies are neither a chain (each step on the one before), a group (none) "
                  "nor a batch (callbacks on every job); seamq runs those three shapes")


def new(body: Any, now: datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A validated workflow record and the jobs to enqueue with it (the first step, or all)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    step_ids = None
    if body.get("type") is None and isinstance(body.get("steps"), list):
        body, step_ids = from_steps(body)
    kind = body.get("type")
    if kind not in KINDS:
        raise invalid(f"workflow type must be one of {', '.join(KINDS)}")
    items = body.get("steps") if kind == "chain" else body.get("jobs")
    field = "steps" if kind == "chain" else "jobs"
    if not isinstance(items, list) or not items:
        raise invalid(f"a {kind} workflow needs a non-empty {field} list")
    queues = {_queue_of(item) for item in items}
    if len(items) + len(queues) > MAX_ITEMS:
        raise invalid(f"a workflow's {field} and their queues number at most {MAX_ITEMS}, "
                      f"got {len(items)} in {len(queues)} queue(s)")
    callbacks = body.get("callbacks") or {}
    if not isinstance(callbacks, dict) or set(callbacks) - set(CALLBACKS):
        raise invalid(f"callbacks may only be {', '.join(CALLBACKS)}")
    if callbacks and kind != "batch":
        raise invalid("callbacks belong to batch workflows")
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name must be a string")
    workflow_id = model.uuid7()
    for index, item in enumerate([*items, *callbacks.values()]):
        try:
            model.new_record(item, now)  # validated now: nothing is created if one item is wrong
        except OjsError as exc:
            where = f"{field}[{index}]" if index < len(items) else "callbacks"
            raise OjsError(exc.status, exc.code, f"{where}: {exc.message}") from None
    workflow = {
        "_key": key(workflow_id), "_kind": "workflow", "id": workflow_id, "type": kind, "name": name,
        "state": RUNNING, "created_at": iso(now),
        f"{field}_total": len(items), f"{field}_completed": 0,
        "_items": items, "_ids": [model.uuid7() for _ in items], "_ended": {}, "_results": {},
        "_callbacks": callbacks, "_callback_ids": {name: model.uuid7() for name in callbacks},
        "_step_ids": step_ids,
    }
    first = [0] if kind == "chain" else range(len(items))
    return workflow, [_job(workflow, i, now) for i in first]


def public(workflow: dict[str, Any], states: dict[str, str]) -> dict[str, Any]:
    """What the suite reads (`steps_total`, `jobs_completed`, ...) with what the SDKs read: `steps`
    with each step's id, type, job and state (Python), and `metadata` with the counts (JS).
    `states` maps the workflow's job ids to their states, where known."""
    items = [*workflow["_items"], *workflow["_callbacks"].values()]
    job_ids = job_ids_of(workflow)
    names = workflow.get("_step_ids") or [*(f"step-{i}" for i in range(len(workflow["_items"]))),
                                          *workflow["_callbacks"]]
    steps = [{"id": name, "type": item.get("type"), "args": item.get("args", []), "job_id": job_id,
              "state": states.get(job_id, "pending")} for name, item, job_id in zip(names, items, job_ids)]
    ended = [states.get(j) for j in workflow["_ids"]]
    metadata = {"created_at": workflow["created_at"], "started_at": workflow["created_at"],
                "completed_at": workflow.get("completed_at"), "job_count": len(workflow["_ids"]),
                "completed_count": ended.count(State.COMPLETED),
                "failed_count": sum(s in ("discarded", "cancelled") for s in ended)}
    return {**model.public(workflow), "steps": steps, "metadata": {k: v for k, v in metadata.items() if v is not None}}


def _job(workflow: dict[str, Any], index: int, now: datetime, parent_results: list[Any] | None = None) -> dict[str, Any]:
    record = model.new_record({**workflow["_items"][index], "id": workflow["_ids"][index]}, now)
    record.update(workflow_id=workflow["id"], workflow_index=index)
    if parent_results is not None:
        record["parent_results"] = parent_results
    return record


def _callback(workflow: dict[str, Any], name: str, now: datetime) -> dict[str, Any]:
    body = {**workflow["_callbacks"][name], "id": workflow["_callback_ids"][name]}
    record = model.new_record(body, now)
    record.update(workflow_id=workflow["id"], parent_results=_results(workflow))
    return record


def _results(workflow: dict[str, Any]) -> list[Any]:
    return [workflow["_results"].get(str(i)) for i in range(len(workflow["_items"]))]


def job_ended(workflow: dict[str, Any], job: dict[str, Any], now: datetime) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A job of `workflow` reached a terminal state: the workflow's new record (None when this
    changes nothing, as for a job ended twice or a workflow already over) and the jobs to enqueue."""
    index = job.get("workflow_index")
    if workflow["state"] != RUNNING or index is None or str(index) in workflow["_ended"]:
        return None, []
    done = {**workflow, "_ended": {**workflow["_ended"], str(index): job["state"]},
            "_results": {**workflow["_results"], str(index): job.get("result")}}
    completed = job["state"] == State.COMPLETED
    total = len(workflow["_items"])
    if workflow["type"] == "chain":
        if completed:
            done["steps_completed"] += 1
        if not completed:
            return {**done, "state": FAILED, "completed_at": iso(now)}, []
        if index + 1 < total:
            return done, [_job(done, index + 1, now, parent_results=_results(done)[:index + 1])]
        return {**done, "state": WF_COMPLETED, "completed_at": iso(now)}, []
    if completed:
        done["jobs_completed"] += 1
    if len(done["_ended"]) < total:
        return done, []
    success = done["jobs_completed"] == total
    done.update(state=WF_COMPLETED if success else FAILED, completed_at=iso(now))
    fire = ["on_complete", "on_success" if success else "on_failure"]
    return done, [_callback(done, name, now) for name in CALLBACKS if name in fire and name in done["_callbacks"]]


def cancelled(workflow: dict[str, Any], now: datetime) -> dict[str, Any]:
    if workflow["state"] != RUNNING:
        raise model.conflict(f"workflow {workflow['id']} is {workflow['state']}: it can no longer be cancelled")
    return {**workflow, "state": CANCELLED, "cancelled_at": iso(now)}


def job_ids_of(workflow: dict[str, Any]) -> list[str]:
    return [*workflow["_ids"], *workflow["_callback_ids"].values()]
