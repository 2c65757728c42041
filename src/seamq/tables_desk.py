"""What people do with the outbox and inbox tables, one rule each, for the CLI (`seamq outbox`,
`seamq inbox purge`, `seamq backlog`) and whatever face comes next: see the backlogs, see the rows
the relay parked and move, retry or drop them, purge what retention allows.

A parked row is one the relay can never publish as it is (its context has no stream, its subject
is invalid, it is larger than the server takes); a person knows whether `shopp` was a typo
(`move`), a context the relay's topology lacked (`retry` once it has it), or an event to let go
(`drop`). An action names one row or one context: never every parked row by omission.
"""

from __future__ import annotations

import uuid

from seamq.model import ErrorCode, SeamqError, validate_token
from seamq.ports import InboxTables, OutboxRepository
from seamq.tables import Backlog, ParkedRow, Purged

CONFIRM_LIMIT = 100_000  # parked rows counted for a drop's confirmation


class TablesDesk:
    def __init__(self, outbox: OutboxRepository, inbox: InboxTables) -> None:
        self.outbox, self.inbox = outbox, inbox

    async def backlog(self) -> Backlog:
        return Backlog(await self.outbox.backlog(), await self.inbox.backlog())

    async def parked(self, context: str | None = None, row_id: uuid.UUID | None = None,
                     limit: int = 1000) -> list[ParkedRow]:
        return await self.outbox.parked(context, row_id, limit)

    async def move(self, context: str, to: str) -> int:
        """A context's parked rows under another context, handed back to the relay; how many."""
        validate_token(to, "context")
        return await self.outbox.unpark(named(context, None)[0], None, to)

    async def retry(self, context: str | None = None, row_id: uuid.UUID | None = None) -> int:
        """Parked rows handed back to the relay as they are (its topology gained their context)."""
        return await self.outbox.unpark(*named(context, row_id))

    async def drop(self, context: str | None = None, row_id: uuid.UUID | None = None, *, confirmed: bool) -> int:
        """Parked rows deleted: their events are never published. Unconfirmed, nothing is deleted and
        CONFIRMATION_NEEDED says how many would be."""
        which = named(context, row_id)
        if not confirmed:
            count = len(await self.outbox.parked(*which, CONFIRM_LIMIT))
            raise SeamqError(ErrorCode.CONFIRMATION_NEEDED, f"{count} parked rows selected; add --yes to delete them")
        return await self.outbox.drop_parked(*which)

    async def purge_outbox(self, older_than: float, batch: int = 5000) -> Purged:
        return await self.outbox.purge(older_than, batch)

    async def purge_inbox(self, older_than: float, batch: int = 5000) -> Purged:
        """Processed rows older than the window, which the caller checked against redelivery
        (seamq.topology.inbox_retention): purged sooner, a copy of a message could be handled twice."""
        return await self.inbox.purge(older_than, batch)


def named(context: str | None, row_id: uuid.UUID | None) -> tuple[str | None, uuid.UUID | None]:
    """One row or one context, never both nor neither (a face may ask before it connects)."""
    if (context is None) == (row_id is None):
        raise SeamqError(ErrorCode.INVALID_CONFIG, "give one row id, or --context")
    return context, row_id
