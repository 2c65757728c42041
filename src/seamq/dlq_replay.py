"""The DLQ replay worker (REQ-059): dead letters go back to their original subject.

Each replayable dead letter (by reason; malformed input is not) is scheduled
with an exponential delay and jitter, re-published when due, and counted in
`dlq_metadata.replay_attempts`; at the cap it is marked `exhausted` and stays
in the DLQ for a person (`seamq dlq ...`).

A replay goes out through seamq.republish with the Nats-Msg-Id
`replay:{consumer}:{id}:{n}`, `Seamq-Replay-Attempt: n`, which tells the
consumer that the dead-lettered inbox row is to be processed, not skipped, and
`Seamq-Replay-Consumer`: every consumer of the subject receives it, and only
the one that dead-lettered it runs it. A publish JetStream reports as a
duplicate was not sent now: that replay went out before (its mark was lost
with a crash), so it is counted once, never reported as replayed again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from seamq import dead_letter
from seamq.health import Health
from seamq.dead_letter import DeadLetterRow, Original, ReplayPolicy, Whole
from seamq.model import describe
from seamq.observability import log
from seamq.ports import DeadLetterRepository, JetStreamPublisher, MessageStore
from seamq.republish import Copy, republish
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology, redelivery_window


class Replayer:
    def __init__(self, dead_letters: DeadLetterRepository[Any], messages: MessageStore, publisher: JetStreamPublisher,
                 topology: Topology, policy: ReplayPolicy, *, nak_max: float, interval: float,
                 health: Health | None = None) -> None:
        self.dead_letters, self.messages, self.publisher, self.topology = dead_letters, messages, publisher, topology
        self.health = health or Health()
        self.policy = policy
        self.interval = interval
        # A replay that never comes back (lost, or its consumer is down) is
        # replayed again after the longest time its consumer could take with it.
        self.watchdog = self.policy.backoff.cap + (redelivery_window(topology, nak_max) or 600)

    async def run(self, stop: asyncio.Event) -> None:
        beat = self.health.beat("replay")
        self.health.started = True
        while not stop.is_set():
            try:
                with beat:
                    await self.run_once()
            except Exception as exc:  # database or broker away: try again next round
                log.warning("replay_round_failed", error=describe(exc))
            await sleep_unless_stopped(stop, self.interval)

    async def run_once(self) -> int:
        async with self.dead_letters.transaction() as tx:
            await self.dead_letters.schedule(tx, self.policy)
        async with self.dead_letters.transaction() as tx:
            return await self.replay(tx, await self.dead_letters.due(tx))

    async def replay(self, tx: Any, rows: list[DeadLetterRow]) -> int:
        """Re-publish each row's original message now; returns how many went out."""
        ready = []
        for row in rows:
            copy = await self._copy(row)
            if copy is not None:
                ready.append((row, copy))
        results = await republish(self.publisher, (copy for _, copy in ready))
        replayed = 0
        for (row, copy), result in zip(ready, results):
            if not result.ok:
                log.warning("replay_publish_failed", message_id=str(row.message_id), error=result.error)
                continue
            await self.dead_letters.mark_replayed(tx, row.consumer, row.message_id, self.watchdog)
            if result.duplicate:
                log.warning("replay_was_in_the_stream", consumer=row.consumer, message_id=str(row.message_id),
                            msg_id=copy.msg_id, why="published before, its mark lost; not sent again")
                continue
            replayed += 1
            log.info("message_replayed", consumer=row.consumer, message_id=str(row.message_id),
                     subject=copy.subject, attempt=copy.replay_attempt, stream_seq=result.seq)
        return replayed

    async def original(self, row: DeadLetterRow) -> Whole | str:
        """The message a dead-lettered inbox row stands for, whole; else why it cannot be had."""
        seq = row.state.dlq_seq
        if row.consumer not in self.topology.consumers or seq is None:
            return "unknown consumer or DLQ copy"
        copy = await self.messages.get(self.topology.dlq_stream(row.consumer), seq)
        if copy is None:
            return "DLQ copy expired or purged"
        original = await read_original(self.messages, dead_letter.read(copy.data))
        whole = original.whole()
        if whole is None:  # too big to travel inside the dead letter, and gone from its stream
            return f"original gone from stream {original.stream} (seq {original.seq})"
        return whole

    async def _copy(self, row: DeadLetterRow) -> Copy | None:
        original = await self.original(row)
        if isinstance(original, str):
            log.warning("replay_skipped", message_id=str(row.message_id), why=original)
            return None
        attempt = row.state.replay_attempts + 1
        return Copy(original.subject, original.headers, original.data, str(row.message_id),
                    msg_id=f"replay:{row.consumer}:{row.message_id}:{attempt}", replay_attempt=attempt,
                    consumer=row.consumer)


async def read_original(messages: MessageStore, original: Original) -> Original:
    """The original with what a dead letter left in its own stream filled in; still incomplete when
    it is gone from there too."""
    if original.complete or original.stream is None or original.seq is None:
        return original
    stored = await messages.get(original.stream, int(original.seq))
    if stored is None:
        return original
    headers = original.headers if original.headers is not None else stored.headers
    return Original(original.subject, headers, stored.data, original.stream, original.seq)
