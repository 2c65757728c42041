"""The audit run once until every walk has caught up, as `seamq audit --once` runs it, in the test's loop."""

from __future__ import annotations

import time
import uuid

import psycopg

from seamq.settings import AuditSettings, NatsSettings, Settings
from seamq.wiring import auditor


async def audit_once(dsn: str, nats_url: str, topology, *, fresh: bool) -> dict:
    """Every walk caught up once: what was checked, found (new), and repaired; `fresh`: from the start."""
    if fresh:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM audit_cursors")
    settings = Settings(database_url=dsn, nats=NatsSettings(url=nats_url), audit=AuditSettings(settle=0))
    cpu = time.process_time()
    async with auditor(settings, topology, persistent=False) as auditing:
        done = await auditing.catch_up()
    return {"checked": done.checked, "found": done.found, "repaired": done.repaired, "missing": done.missing,
            "rounds": done.rounds, "cpu": time.process_time() - cpu}


def by_kind(found) -> dict[str, set[uuid.UUID]]:
    out: dict[str, set[uuid.UUID]] = {}
    for f in found:
        out.setdefault(f.kind, set()).add(f.message_id)
    return out
