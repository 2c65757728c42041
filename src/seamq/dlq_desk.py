"""What people do with dead letters, one rule each, for the CLI (`seamq dlq`) and the console alike:
list, group by cause, look at one, replay, purge, edit and replay.

Every action names the rows it acts on (the set a person was shown, never a filter evaluated
again later, so failures arriving meanwhile are not swept in) and is recorded before it starts
and finished after it (`operator_actions`, migration 0008): who, what, when, how many selected
and how many done. An action cut short stays unfinished in the record, never reported as done.

An edited copy is a new message (its own id, so no inbox and no duplicate window takes it for
the original) that names the original (`Seamq-Edit-Of`) and is for the consumer that
dead-lettered it only (`Seamq-Replay-Consumer`); the original is closed (`edited_as`) and both
stay in the record.
"""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Mapping

from seamq import dead_letter
from seamq.dead_letter import Action, DeadLetterRow, DlqFilter, Group
from seamq.dlq_replay import Replayer, read_original
from seamq.ids import uuid7
from seamq.model import ErrorCode, Header, OutMessage, SeamqError, describe
from seamq.observability import log
from seamq.ports import DeadLetterRepository, MessageStore

CHUNK = 100  # dead letters per transaction of a replay or purge
SHOWN_PAYLOAD = 64 * 1024  # a larger original is cut where people read it (replay sends all of it)


@dataclass(frozen=True)
class Done:
    selected: int
    done: int
    action_id: int


class DeadLetterReader:
    """What people read of dead letters and the inbox: the database is all it needs."""

    def __init__(self, store: DeadLetterRepository[Any]) -> None:
        self.store = store

    async def select(self, selection: DlqFilter) -> list[DeadLetterRow]:
        async with self.store.transaction() as tx:
            return await self.store.select(tx, selection)

    async def groups(self, selection: DlqFilter) -> list[Group]:
        async with self.store.transaction() as tx:
            return await self.store.groups(tx, selection)

    async def actions(self, limit: int = 100, message_id: uuid.UUID | None = None) -> list[Action]:
        async with self.store.transaction() as tx:
            return await self.store.actions(tx, limit, message_id)

    async def inbox_record(self, prefix: str) -> list[DeadLetterRow]:
        """A message as each consumer's inbox has it, in any state, with every failed attempt."""
        async with self.store.transaction() as tx:
            return await self.store.with_attempts(tx, await self.store.inbox_rows(tx, prefix))


class DeadLetterDesk(DeadLetterReader):
    def __init__(self, replayer: Replayer) -> None:
        super().__init__(replayer.dead_letters)
        self.replayer, self.topology = replayer, replayer.topology

    @property
    def messages(self) -> MessageStore:
        """The replayer's: the console puts the real one in once it has joined NATS."""
        return self.replayer.messages

    async def detail(self, rows: list[DeadLetterRow]) -> list[DeadLetterRow]:
        """Each row with its failed attempts, its DLQ copy (the original filled in) and the actions on it."""
        async with self.store.transaction() as tx:
            rows = [replace(row, actions=tuple(await self.store.actions(tx, message_id=row.message_id)))
                    for row in await self.store.with_attempts(tx, rows)]
        return [replace(row, dlq_copy=await self.copy_of(row)) for row in rows]

    async def copy_of(self, row: DeadLetterRow) -> Mapping[str, Any]:
        """The DLQ copy's body; an original too big for it is read from its own stream."""
        seq = row.state.dlq_seq
        if seq is None:
            return {"error": "no DLQ copy recorded"}
        stream = self.topology.dlq_stream(row.consumer)
        try:
            stored = await self.messages.get(stream, seq)
        except Exception as exc:  # NATS away: the rest of what is known about it still shows
            return {"error": f"the DLQ copy ({stream} seq {seq}) cannot be read now: "
                             f"{exc.message if isinstance(exc, SeamqError) else describe(exc)}"}
        if stored is None:
            return {"error": f"DLQ copy gone from {stream} (seq {seq}): expired or purged"}
        copy: dict[str, Any] = json.loads(stored.data)
        original = dead_letter.original_message(copy)
        if original.complete:
            return copy
        original = await read_original(self.messages, original)
        whole = original.whole()
        if whole is None:
            copy["original_payload"] = f"(not in the dead letter, and gone from {original.stream} seq {original.seq})"
            return copy
        text = whole.data.decode(errors="replace")
        cut = f"... ({len(whole.data)} bytes in all)" if len(text) > SHOWN_PAYLOAD else ""
        copy.update(original_headers=whole.headers, original_payload=text[:SHOWN_PAYLOAD] + cut,
                    original_payload_encoding=f"read from {whole.stream} seq {whole.seq}")
        return copy

    async def replay(self, rows: list[DeadLetterRow], actor: str, progress: Callable[[int], None] = lambda n: None) -> Done:
        """Re-publish now, bypassing the backoff (exhausted and non-replayable ones too)."""
        async with self.recorded(actor, "dlq.replay", rows) as record:
            for start in range(0, len(rows), CHUNK):
                chunk = rows[start:start + CHUNK]
                async with self.store.transaction() as tx:
                    record.done += await self.replayer.replay(tx, chunk)
                progress(len(chunk))
        return record.result()

    async def purge(self, rows: list[DeadLetterRow], actor: str, progress: Callable[[int], None] = lambda n: None) -> Done:
        """Delete the DLQ copies; the inbox rows stay (marked purged) to keep deduplicating."""
        async with self.recorded(actor, "dlq.purge", rows) as record:
            for row in rows:
                if row.state.dlq_seq is not None:  # gone already (max_age, an earlier purge) is fine
                    await self.messages.delete(self.topology.dlq_stream(row.consumer), row.state.dlq_seq)
                async with self.store.transaction() as tx:
                    await self.store.mark_purged(tx, row.consumer, row.message_id)
                record.done += 1
                progress(1)
        return record.result()

    async def edit_and_replay(self, row: DeadLetterRow, payload: bytes, actor: str) -> uuid.UUID:
        """Publish the original with `payload` as its body, as a new message for the same consumer;
        close the original. Refused (SeamqError) when the body is not a JSON object or the original is gone."""
        try:
            body = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise SeamqError(ErrorCode.INVALID_INPUT, f"the edited body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise SeamqError(ErrorCode.INVALID_INPUT, "the edited body must be a JSON object, as every event's is")
        original = await self.replayer.original(row)
        if isinstance(original, str):
            raise SeamqError(ErrorCode.NOT_FOUND, f"the original cannot be read: {original}")
        new_id = uuid7()
        headers = {k: v for k, v in original.headers.items()
                   if k not in (Header.MSG_ID, Header.REPLAY_MESSAGE_ID, Header.REPLAY_ATTEMPT, Header.REPLAY_CONSUMER, Header.EDIT_OF)}
        headers.update({Header.MSG_ID: str(new_id), Header.EDIT_OF: str(row.message_id), Header.REPLAY_CONSUMER: row.consumer})
        async with self.recorded(actor, "dlq.edit_replay", [row], new_message_id=str(new_id)) as record:
            # Closed and published in one transaction: closed meanwhile means nothing is sent; not sent
            # means it stays open. (A crash between the publish and the commit leaves it open, with the
            # action unfinished and naming the copy.)
            async with self.store.transaction() as tx:
                if not await self.store.mark_edited(tx, row.consumer, row.message_id, new_id, actor):
                    raise SeamqError(ErrorCode.NOT_FOUND, "the dead letter was closed meanwhile (purged, or edited "
                                                          "by someone else); nothing was sent")
                out = OutMessage(original.subject, payload, headers)
                result = (await self.replayer.publisher.publish_many([out]))[0]
                if not result.ok:
                    raise SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"the edited copy was not published: "
                                                                   f"{result.error}")
            record.done = 1
        log.info("dead_letter_edited", consumer=row.consumer, message_id=str(row.message_id),
                 new_message_id=str(new_id), actor=actor)
        return new_id

    async def refused(self, actor: str, action: str, **detail: Any) -> None:
        """A request refused before it did anything, in the audit: an action that selected and did
        nothing, with why."""
        async with self.store.transaction() as tx:
            action_id = await self.store.start_action(tx, actor, action, [], detail)
            await self.store.finish_action(tx, action_id, 0, {})

    @asynccontextmanager
    async def recorded(self, actor: str, action: str, rows: list[DeadLetterRow], **detail: Any) -> AsyncIterator["_Record"]:
        async with self.store.transaction() as tx:
            action_id = await self.store.start_action(tx, actor, action, [r.message_id for r in rows], detail)
        record = _Record(action_id, len(rows))
        try:
            yield record
        except BaseException as exc:
            async with self.store.transaction() as tx:
                await self.store.finish_action(tx, action_id, record.done, {"error": describe(exc)})
            raise
        async with self.store.transaction() as tx:
            await self.store.finish_action(tx, action_id, record.done, {})
        log.info("operator_action", action=action, actor=actor, selected=len(rows), done=record.done, id=action_id)


@dataclass
class _Record:
    action_id: int
    selected: int
    done: int = 0

    def result(self) -> Done:
        return Done(self.selected, self.done, self.action_id)
