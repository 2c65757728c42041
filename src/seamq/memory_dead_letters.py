"""The dead-letter repository in memory, over the in-memory inboxes (seamq.memory): the replay worker
and the desk run on it without services, in the unit tier.

It keeps the port's contract (tests/contracts/messaging/test_dead_letter_contract.py runs one suite against it and
against PostgreSQL), not PostgreSQL's ways: rows are read where they are, a transaction that fails
leaves nothing, times are the wall clock's.
"""

from __future__ import annotations

import copy
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import AsyncIterator, Iterable, Mapping

from seamq.dead_letter import Action, DeadLetterRow, DlqFilter, Group, ReplayPolicy, cause
from seamq.memory import MemoryInbox, Row, now
from seamq.model import CONSUMER_SEPARATOR

DEAD = ("dead_lettered", "exhausted")


@dataclass
class _Action:
    id: int
    actor: str
    action: str
    message_ids: list[uuid.UUID]
    detail: dict[str, object]
    started_at: datetime = field(default_factory=now)
    finished_at: datetime | None = None
    done: int | None = None

    def typed(self) -> Action:
        return Action(self.id, self.started_at, self.finished_at, self.actor, self.action, len(self.message_ids),
                      self.done, len(self.message_ids), dict(self.detail))


class MemoryDeadLetters:
    """The dead letters of `inboxes` (consumer name -> its inbox); the unit of work is this object."""

    def __init__(self, inboxes: Mapping[str, MemoryInbox]) -> None:
        self.inboxes = inboxes
        self.log: list[_Action] = []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["MemoryDeadLetters"]:
        before = copy.deepcopy(({name: inbox.rows for name, inbox in self.inboxes.items()}, self.log))
        try:
            yield self
        except BaseException:  # rolled back
            rows, self.log = before
            for name, inbox in self.inboxes.items():
                inbox.rows = rows[name]
            raise

    def _all(self) -> Iterable[tuple[str, uuid.UUID, Row]]:
        for consumer, inbox in self.inboxes.items():
            for message_id, row in inbox.rows.items():
                yield consumer, message_id, row

    def _row(self, consumer: str, message_id: uuid.UUID) -> Row | None:
        inbox = self.inboxes.get(consumer)
        return inbox.rows.get(message_id) if inbox else None

    async def schedule(self, tx: MemoryDeadLetters, policy: ReplayPolicy) -> None:
        for _, _, row in self._all():
            replays = row.state.replay_attempts
            if row.status != "dead_lettered" or row.state.reason not in policy.reasons:
                continue
            if replays >= policy.max_attempts:
                row.status, row.dlq["exhausted_at"] = "exhausted", now()
            elif row.dlq.get("next_replay_at") is None:
                delay = policy.delay(replays)
                row.dlq.update(next_replay_at=now() + timedelta(seconds=delay), replay_delay=delay,
                               replay_scheduled_at=now())

    async def due(self, tx: MemoryDeadLetters, limit: int = 100) -> list[DeadLetterRow]:
        ready = [(at, consumer, message_id, row) for consumer, message_id, row in self._all()
                 if row.status == "dead_lettered" and (at := row.state.next_replay_at) is not None and at <= now()]
        return [_typed(c, m, r) for _, c, m, r in sorted(ready, key=lambda entry: entry[0])[:limit]]

    async def mark_replayed(self, tx: MemoryDeadLetters, consumer: str, message_id: uuid.UUID,
                            watchdog: float) -> None:
        if (row := self._row(consumer, message_id)) is None:
            return
        row.status = "dead_lettered" if row.status == "exhausted" else row.status
        row.dlq.update(replay_attempts=row.state.replay_attempts + 1, last_replayed_at=now(),
                       last_reason=row.dlq.get("reason"), next_replay_at=now() + timedelta(seconds=watchdog))

    async def select(self, tx: MemoryDeadLetters, selection: DlqFilter) -> list[DeadLetterRow]:
        chosen = sorted(((c, m, r) for c, m, r in self._all() if _chosen(selection, c, m, r)),
                        key=lambda e: (e[2].state.dead_lettered_at or now(), e[1]))
        return [_typed(c, m, r, total=len(chosen)) for c, m, r in chosen[:selection.limit]]

    async def groups(self, tx: MemoryDeadLetters, selection: DlqFilter) -> list[Group]:
        found: dict[tuple[str, str | None], list[tuple[str, Row]]] = {}
        for consumer, message_id, row in self._all():
            if _chosen(selection, consumer, message_id, row):
                found.setdefault((cause(row.state.reason, row.last_error), row.state.reason), []).append((consumer, row))
        out = [Group(c, reason, len(rows), len({name for name, _ in rows}), min(r.received_at for _, r in rows),
                     max(r.received_at for _, r in rows)) for (c, reason), rows in found.items()]
        return sorted(out, key=lambda g: (-g.count, g.cause))[:200]

    async def with_attempts(self, tx: MemoryDeadLetters, rows: list[DeadLetterRow]) -> list[DeadLetterRow]:
        return [replace(row, failed_attempts=tuple(found.history if (found := self._row(*row.key)) else ()))
                for row in rows]

    async def inbox_rows(self, tx: MemoryDeadLetters, prefix: str) -> list[DeadLetterRow]:
        found = sorted(((m, c, r) for c, m, r in self._all() if str(m).startswith(prefix)), key=lambda e: e[:2])
        return [_typed(c, m, r) for m, c, r in found[:50]]

    async def mark_purged(self, tx: MemoryDeadLetters, consumer: str, message_id: uuid.UUID) -> None:
        if (row := self._row(consumer, message_id)) is not None:
            row.status = "exhausted"
            row.dlq.update(purged_at=now(), next_replay_at=None)

    async def mark_edited(self, tx: MemoryDeadLetters, consumer: str, message_id: uuid.UUID, new_id: uuid.UUID,
                          actor: str) -> bool:
        row = self._row(consumer, message_id)
        if row is None or row.status not in DEAD or row.dlq.get("edited_as") is not None:
            return False
        row.status = "exhausted"
        row.dlq.update(edited_as=str(new_id), edited_at=now(), edited_by=actor, next_replay_at=None)
        return True

    async def start_action(self, tx: MemoryDeadLetters, actor: str, action: str, message_ids: list[uuid.UUID],
                           detail: Mapping[str, object]) -> int:
        self.log.append(_Action(len(self.log) + 1, actor, action, list(message_ids), dict(detail)))
        return len(self.log)

    async def finish_action(self, tx: MemoryDeadLetters, action_id: int, done: int,
                            detail: Mapping[str, object]) -> None:
        entry = self.log[action_id - 1]
        entry.finished_at, entry.done = now(), done
        entry.detail.update(detail)

    async def actions(self, tx: MemoryDeadLetters, limit: int = 100, message_id: uuid.UUID | None = None
                      ) -> list[Action]:
        if message_id is None:
            return [entry.typed() for entry in reversed(self.log)][:limit]
        return [entry.typed() for entry in self.log if message_id in entry.message_ids]


def _chosen(s: DlqFilter, consumer: str, message_id: uuid.UUID, row: Row) -> bool:
    """dlq_where (queries.sql), read plainly: every filter None means any."""
    state = row.state
    old = None if s.older_than is None else now() - timedelta(seconds=s.older_than)
    return (row.status in DEAD
            and s.consumer in (None, consumer)
            and s.context in (None, consumer.split(CONSUMER_SEPARATOR)[0])
            and s.event_type in (None, row.event_type)
            and s.reason in (None, state.reason)
            and (old is None or (state.dead_lettered_at is not None and state.dead_lettered_at < old))
            and (s.since is None or row.received_at >= s.since)
            and (s.until is None or row.received_at < s.until)
            and (s.text is None or s.text.lower() in (row.last_error or "").lower())
            and s.cause in (None, cause(state.reason, row.last_error))
            and (s.ids is None or message_id in s.ids)
            and (s.prefix is None or str(message_id).startswith(s.prefix))
            and (s.purged or not state.closed))


def _typed(consumer: str, message_id: uuid.UUID, row: Row, total: int = 1) -> DeadLetterRow:
    return DeadLetterRow(consumer, message_id, row.state, row.subject, row.event_type, row.event_version, row.status,
                         row.attempts, row.duplicates, row.last_error, row.received_at, row.processed_at,
                         cause(row.state.reason, row.last_error), total)
