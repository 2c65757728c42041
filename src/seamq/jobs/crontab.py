"""Cron jobs over the store: registered, enabled or disabled, listed, deleted and fired.

The expressions are seamq.jobs.cron's (no I/O). A cron's next run is a timer
in the store, which fires once to one server whichever servers run; the fire
enqueues its job and moves the cron's `next_run_at` in one atomic batch, by
compare-and-set on the cron's record, so a tick fired twice (a server that died
before it said done) enqueues one job.
"""

from __future__ import annotations

from typing import Any

from seamq.jobs import cron, model
from seamq.jobs.admission import Admission
from seamq.jobs.model import OjsError, conflict, iso
from seamq.jobs.ports import Conflict, Stored, Write


class Crontab:
    def __init__(self, admission: Admission) -> None:
        """`admission` arms a cron's timer and creates the job each fire enqueues (seamq.jobs.admission)."""
        self.admission, self.store = admission, admission.store

    async def register(self, body: Any) -> dict:
        record = cron.new(body, self.admission.clock())
        held = await self.store.get(record["_key"])
        try:
            await self.store.commit([Write(record["_key"], record, held.revision if held else 0)])
        except Conflict:
            raise conflict(f"cron {record['name']} changed while it was registered") from None
        if record["enabled"]:
            await self._arm(record)
        return cron.public(record)

    async def _load(self, name: str) -> Stored:
        held = await self.store.get(cron.key(name))
        if held is None:
            raise OjsError(404, "not_found", f"cron {name} not found")
        return held

    async def set_enabled(self, name: str, enabled: bool) -> dict:
        held = await self._load(name)
        record = {**held.record, "enabled": enabled}
        if enabled:
            record["next_run_at"] = iso(cron.parse(record["expression"]).next_after(self.admission.clock(), record["timezone"]))
        try:
            await self.store.commit([Write(record["_key"], record, held.revision)])
        except Conflict:
            raise conflict(f"cron {name} changed while it was {'enabled' if enabled else 'disabled'}") from None
        if enabled:
            await self._arm(record)
        else:
            await self.store.disarm("cron", record["_key"])
        return cron.public(record)

    async def get(self, name: str) -> dict:
        return cron.public((await self._load(name))[0])

    async def listing(self) -> list[dict]:
        """Read from the store (nobody needs crons on a hot path, so no server follows them): a cron
        another server has just registered or deleted is listed as it is now."""
        return sorted((cron.public(r) for r, _ in await self.store.scan("cron.")), key=lambda c: c["name"])

    async def delete(self, name: str) -> dict:
        record, _ = await self._load(name)
        await self.store.delete(record["_key"])
        await self.store.disarm("cron", record["_key"])
        return cron.public(record)

    async def _arm(self, record: dict) -> None:
        at = model.parse_time(record["next_run_at"])
        await self.admission.arm("cron", record["_key"], at, {"attempt": int(at.timestamp() * 1000)})

    async def fire(self, key: str, due_ms: Any) -> None:
        held = await self.store.get(key)
        if held is None or not held.record.get("enabled", True):
            return
        record, revision = held
        due = model.parse_time(record["next_run_at"])
        if int(due.timestamp() * 1000) != due_ms:
            return  # a timer for a run that is no longer the next one
        now = self.admission.clock()
        following = {**record, "next_run_at": iso(cron.parse(record["expression"]).next_after(
            max(now, due), record["timezone"]))}
        last = await self.store.get(record.get("_last_job_id") or "-")
        if record["overlap_policy"] == "skip" and last is not None and last.record["state"] not in model.FINISHED:
            try:
                await self.store.commit([Write(key, following, revision)])
            except Conflict:
                return  # another server fired it, or it changed
            await self.admission.events.emit("cron.skipped", last.record)
        else:
            job = model.new_record(record["job_template"], now)
            following["_last_job_id"] = job["id"]
            try:
                await self.admission.create([job], also=[Write(key, following, revision)])
            except OjsError:  # fired already, or the cron changed (deleted, replaced) since this was armed
                return
            await self.admission.events.emit("cron.triggered", job)
        await self._arm(following)
