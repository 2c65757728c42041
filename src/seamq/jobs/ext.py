"""The extensions' operations, over the engine's records: the schema registry, job progress and
checkpoints.

Kept beside the engine rather than in it: they read and write records through
the store's compare-and-set, and add no clock and no transition. The schemas
are among the records every server follows (seamq.jobs.queues), so a push
naming one is checked without a read.
"""

from __future__ import annotations

from typing import Any

from seamq.jobs.job import Job, State, replace
from seamq.jobs import checkpoints, schemas
from seamq.jobs.events import Events
from seamq.jobs.model import CHECKPOINT, OjsError, conflict, invalid, iso, utcnow
from seamq.jobs.operations import Operations
from seamq.jobs.ports import Conflict, JobStore, Write
from seamq.jobs.queues import Queues


class Schemas:
    def __init__(self, store: JobStore, queues: Queues) -> None:
        self.store, self.queues = store, queues

    def _all(self) -> list[dict]:
        return self.queues.of("schema.")

    async def put(self, record: dict) -> tuple[int, dict]:
        """201 for a new (type, version); 200 for the same schema again; 409 for another schema."""
        held = await self.store.get(record["_key"])
        if held is not None:
            if held.record["schema"] == record["schema"] and held.record["uri"] == record["uri"]:
                return 200, schemas.public(held.record)
            raise OjsError(409, "duplicate", f"schema {record['type']} version {record['version']} is registered "
                                             "with another schema; register a new version")
        taken = self.by_uri(record["uri"], missing_ok=True)
        if taken is not None:
            raise OjsError(409, "duplicate", f"uri {record['uri']} names {taken['type']} version {taken['version']}")
        try:
            await self.store.commit([Write(record["_key"], record, 0)])
        except Conflict:
            raise conflict(f"schema {record['type']} version {record['version']} changed while it was "
                           "registered") from None
        self.queues.kept(record["_key"], record)
        return 201, schemas.public(record)

    def list(self, job_type: str | None = None) -> list[dict]:
        found = [r for r in self._all() if job_type is None or r["type"] == job_type]
        return [schemas.public(r) for r in sorted(found, key=lambda r: (r["type"], schemas.order(r["version"])))]

    def get(self, job_type: str, version: Any = None) -> dict:
        if version is None:
            found = self.list(job_type)
            if not found:
                raise OjsError(404, "not_found", f"no schema registered for {job_type}")
            return found[-1]
        held = self.queues.flags.get(schemas.key(job_type, schemas.version_of(version)))
        if held is None:
            raise OjsError(404, "not_found", f"no schema {job_type} version {version}")
        return schemas.public(held)

    def by_uri(self, uri: str, *, missing_ok: bool = False) -> dict | None:
        found = next((r for r in self._all() if r["uri"] == uri), None)
        if found is None and not missing_ok:
            raise OjsError(404, "not_found", f"no schema {uri}")
        return found

    async def delete(self, record: dict) -> dict:
        await self.store.delete(record["_key"])
        self.queues.kept(record["_key"], None)
        return {"deleted": True, **schemas.public(record)}

    def check(self, record: dict) -> None:
        """A job naming a schema (`"schema": uri`) is enqueued only with args that match it; one whose
        meta asks for validation (`ojs_validate: true`, the middleware suite's validating middleware)
        only with args that match its type's latest schema, which must be registered (else 422)."""
        if (record.get("meta") or {}).get("ojs_validate") is True:
            self._validated(record)
        uri = record.get("schema")
        if uri is None:
            return
        if not isinstance(uri, str):
            raise invalid("schema must be the uri of a registered schema")
        found = self.by_uri(uri, missing_ok=True)
        if found is None:
            raise invalid(f"schema {uri} is not registered: register it first (POST /ojs/v1/schemas)")
        schemas.check_args(found, record["args"])

    def _validated(self, record: dict) -> None:
        known = self.list(record["type"])
        if not known:
            raise OjsError(422, "validation_failed", f"meta.ojs_validate asks that the args of {record['type']} be "
                                                     "checked, and no schema is registered for that type")
        try:
            schemas.check_args(known[-1], record["args"])
        except OjsError as exc:
            raise OjsError(422, "validation_failed", exc.message, details=exc.details) from None


def progress_value(body: Any) -> tuple[float, str | None, Any]:
    """`progress` 0..1 (the suite) or `percentage` 0..100 (the SDKs), clamped to the range."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    given = []
    for name, scale in (("progress", 1.0), ("percentage", 100.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise invalid(f"{name} must be a number")
        given.append(min(max(value / scale, 0.0), 1.0))
    if not given:
        raise invalid("progress (0 to 1) or percentage (0 to 100) is required")
    if len(given) == 2 and abs(given[0] - given[1]) > 1e-9:
        raise invalid("progress and percentage disagree: send one")
    message, data = body.get("message"), body.get("data")
    if message is not None and not isinstance(message, str):
        raise invalid("message must be a string")
    if data is not None and not isinstance(data, dict):
        raise invalid("data must be an object")
    return given[0], message, data


async def report_progress(ops: Operations, events: Events, job_id: Any, body: Any) -> dict:
    value, message, data = progress_value(body)

    def move(job: Job) -> Job:
        if job.state != State.ACTIVE:
            raise conflict(f"cannot report progress of job {job.id}: it is {job.state.value}, not active")
        return replace(job, extra={**job.extra, "progress": value, "progress_message": message,
                                   "progress_data": data, "progress_updated_at": iso(utcnow())})

    _, _, record = await ops.change(job_id, move)
    await events.emit("job.progress", record, progress=value, message=message)
    return progress_of(record)


def progress_of(record: dict) -> dict:
    value = record.get("progress")
    answer = {"job_id": record["id"], "state": record["state"], "progress": value,
              "percentage": round(value * 100, 2) if value is not None else None,
              "message": record.get("progress_message"), "data": record.get("progress_data"),
              "updated_at": record.get("progress_updated_at")}
    return {k: v for k, v in answer.items() if v is not None or k == "progress"}


async def save_checkpoint(ops: Operations, events: Events, job_id: Any, body: Any) -> dict:
    save = checkpoints.given(body)
    _, job, record = await ops.change(job_id, lambda job: checkpoints.saved(job, save, ops.clock()))
    held = job.extra[CHECKPOINT]
    await events.emit("job.checkpointed", record, sequence=held["sequence"])
    return checkpoints.shown(job.id, held, with_state=False)


async def checkpoint_of(ops: Operations, job_id: Any) -> tuple[str, dict | None]:
    record = await ops.record(job_id)
    return record["id"], record.get(CHECKPOINT)


async def delete_checkpoint(ops: Operations, job_id: Any) -> dict:
    """Idempotent: a job without a checkpoint answers `deleted: false`, and nothing is written."""
    found, held = await checkpoint_of(ops, job_id)
    if held is not None:
        await ops.change(found, checkpoints.cleared)
    return {"deleted": held is not None, "job_id": found}
