"""Unique jobs (`options.unique`) over the store: a lock per fingerprint, held by the job that took it
for the unique period, checked against that job's state, so that it holds across servers."""

from __future__ import annotations

import hashlib
import json
from typing import Awaitable, Callable

from seamq.jobs import model
from seamq.jobs.model import OjsError
from seamq.jobs.ports import JobStore


def fingerprint(record: dict) -> str:
    """sha256 of the canonical JSON of the unique keys' values."""
    keys = model.unique_keys(record.get("unique") or {}) or ["type", "args"]
    subject = {k: record.get(k, (record.get("options") or {}).get(k)) for k in keys}
    return hashlib.sha256(json.dumps(subject, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def apply(store: JobStore, record: dict, cancel: Callable[[str], Awaitable[dict]]) -> dict | None:
    """None to go on and create `record`, or the existing job (on_conflict: ignore); 409 (reject)."""
    unique = record.get("unique")
    if not unique:
        return None
    key = fingerprint(record)
    period = model.parse_duration(unique["period"]) if unique.get("period") else None
    holder_id = await store.lock_unique(key, record["id"], period)
    if holder_id is None:
        return None
    holder = await store.get(holder_id)
    states = unique.get("states") or [s.value for s in model.STATES if s not in model.FINISHED]
    if holder is None or holder.record["state"] not in states:
        await store.take_unique(key, record["id"], period)
        return None
    policy = unique.get("on_conflict", "reject")
    if policy == "ignore":
        return holder.record
    if policy == "replace":
        await cancel(holder_id)
        await store.take_unique(key, record["id"], period)
        return None
    raise OjsError(409, "duplicate", f"a unique job already exists: {holder_id}",
                   details={"existing_job_id": holder_id})
