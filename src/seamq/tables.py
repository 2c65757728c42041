"""What people read of the outbox and inbox tables and do to them: the backlogs, the rows the relay
parked, a purge's result. Values the repositories return (seamq.ports) and the faces show, so that
the CLI and the console read fields, never a driver's rows.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, NamedTuple


@dataclass(frozen=True)
class ContextBacklog:
    """One context's unpublished outbox rows (QRY-050). Delayed rows (deliver_at later) and parked
    ones are counted apart: neither is late."""

    context: str
    count: int  # waiting to be published now
    oldest_at: datetime | None  # when the oldest of those could first be published
    failing: int  # waiting after a failed attempt
    delayed: int
    parked: int

    @classmethod
    def empty(cls, context: str) -> "ContextBacklog":
        return cls(context, 0, None, 0, 0, 0)


class ConsumerBacklog(NamedTuple):
    """One consumer's inbox rows received and not yet processed (QRY-051)."""

    consumer: str
    unprocessed: int
    oldest_at: datetime | None


class ParkedRow(NamedTuple):
    """An outbox row the relay can never publish as it is, set aside for a person, with why."""

    id: uuid.UUID
    context: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    event_version: int
    parked_reason: str
    parked_at: datetime
    created_at: datetime


@dataclass(frozen=True)
class Purged:
    """What a purge took: whole dated partitions dropped (their unfinished rows kept), rows deleted."""

    partitions: int = 0
    kept: int = 0
    deleted: int = 0

    @property
    def said(self) -> str:
        return (f"dropped {self.partitions} partitions ({self.kept} unfinished rows kept in the default one), "
                f"deleted {self.deleted} rows")


@dataclass(frozen=True)
class Backlog:
    outbox: list[ContextBacklog]
    inbox: list[ConsumerBacklog]

    def plain(self) -> dict[str, Any]:
        return {"outbox": [asdict(row) for row in self.outbox], "inbox": [row._asdict() for row in self.inbox]}
