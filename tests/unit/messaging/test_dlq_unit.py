"""The DLQ replay and the desk (seamq.dlq_replay, seamq.dlq_desk) on the in-memory ports, in
milliseconds: dead letters made as the consumer makes them (its dead-letter message, its inbox
outcome), then replayed, purged and recorded as people and the replay worker do. The same logic
against PostgreSQL and NATS is tests/integration/messaging/test_replay.py's; the port's contract, tests/contracts/messaging/test_dead_letter_contract.py's."""

from __future__ import annotations

import json

from seamq import dead_letter
from seamq.backoff import NO_JITTER, Backoff
from seamq.dead_letter import DlqFilter, ReplayPolicy
from seamq.dlq_desk import DeadLetterDesk
from seamq.dlq_replay import Replayer
from seamq.envelope import Reason
from seamq.ids import uuid7
from seamq.memory import MemoryInbox, MemoryMessages, MemoryPublisher
from seamq.memory_dead_letters import MemoryDeadLetters
from seamq.model import Header
from seamq.ports import DeadLettered, InboxItem, InboxOutcome
from seamq.topology import load_topology

TOPOLOGY = load_topology()
CONSUMER = "sea__from_vibespro"
POLICY = ReplayPolicy(Backoff(base=0, spread=NO_JITTER), max_attempts=3, reasons=(Reason.MAX_DELIVER.value,))


class World:
    def __init__(self, *, publish_fails: bool = False) -> None:
        self.inbox, self.messages, self.publisher = MemoryInbox(), MemoryMessages(), MemoryPublisher(fail=publish_fails)
        self.dead = MemoryDeadLetters({CONSUMER: self.inbox})
        self.replayer = Replayer(self.dead, self.messages, self.publisher, TOPOLOGY, POLICY, nak_max=60, interval=1)
        self.desk = DeadLetterDesk(self.replayer)

    async def dead_letter(self, reason: Reason = Reason.MAX_DELIVER, body: bytes = b'{"total": -1}'):
        """As the consumer does: the dead letter published to the DLQ stream, then the inbox row's outcome."""
        item = InboxItem(uuid7(), "vibespro.event.order_placed.v1", "order_placed", 1, None)
        letter = dead_letter.message(TOPOLOGY.consumers[CONSUMER], reason=reason, detail="boom",
                                     message_id=item.message_id, original_subject=item.subject,
                                     headers={Header.MSG_ID: str(item.message_id)}, data=body, stream="VIBESPRO_EVENTS",
                                     seq=9, attempts=1, max_payload=1 << 20)
        seq = self.messages.put(TOPOLOGY.dlq_stream(CONSUMER), letter)
        async with self.inbox.transaction() as work:
            await self.inbox.admit(work, [item])
            await self.inbox.record(work, [InboxOutcome(item.message_id, attempts=1, dead_letter=DeadLettered(
                reason.value, "boom", letter.subject, seq))])
        return item.message_id

    async def rows(self, **chosen):
        return await self.desk.select(DlqFilter(purged=True, **chosen))


async def test_a_replayable_dead_letter_goes_back_to_its_subject_once_per_round_and_is_counted():
    world = World()
    replayable = await world.dead_letter()
    await world.dead_letter(Reason.HANDLER_REJECTED)  # a person's to look at: never replayed by itself
    assert await world.replayer.run_once() == 1
    [sent] = world.publisher.published
    assert (sent.subject, sent.payload) == ("vibespro.event.order_placed.v1", b'{"total": -1}')
    assert (sent.headers[Header.REPLAY_ATTEMPT], sent.headers[Header.REPLAY_CONSUMER]) == ("1", CONSUMER)
    assert sent.headers[Header.MSG_ID] == f"replay:{CONSUMER}:{replayable}:1"
    assert await world.replayer.run_once() == 0  # watched now: sent again only if it never comes back
    [row] = await world.rows(ids=[replayable])
    assert row.state.replay_attempts == 1 and row.state.last_replayed_at is not None


async def test_a_replay_that_could_not_be_sent_is_not_counted():
    world = World(publish_fails=True)
    message = await world.dead_letter()
    assert await world.replayer.run_once() == 0
    [row] = await world.rows(ids=[message])
    assert row.state.replay_attempts == 0 and world.publisher.published == []


async def test_the_desk_replays_purges_and_records_each_action_with_what_it_did():
    world = World()
    kept, purged, gone = [await world.dead_letter(Reason.HANDLER_REJECTED) for _ in range(3)]
    [gone_row] = await world.rows(ids=[gone])
    await world.messages.delete(TOPOLOGY.dlq_stream(CONSUMER), gone_row.state.dlq_seq)  # expired meanwhile
    done = await world.desk.replay(await world.rows(ids=[kept, gone]), "test:ada")
    assert (done.selected, done.done) == (2, 1), "a dead letter whose copy is gone is not reported as replayed"
    assert [m.headers[Header.REPLAY_MESSAGE_ID] for m in world.publisher.published] == [str(kept)]
    [row] = await world.rows(ids=[purged])
    assert (await world.desk.purge([row], "test:bob")).done == 1
    assert await world.messages.get(TOPOLOGY.dlq_stream(CONSUMER), row.state.dlq_seq) is None
    assert [r.message_id for r in await world.desk.select(DlqFilter())] == [kept, gone]  # purged: closed
    actions = await world.desk.actions()
    assert [(a.action, a.actor, a.selected, a.done) for a in actions] == [
        ("dlq.purge", "test:bob", 1, 1), ("dlq.replay", "test:ada", 2, 1)]
    [shown] = await world.desk.detail(await world.rows(ids=[kept]))
    assert [a.action for a in shown.actions] == ["dlq.replay"]
    assert json.loads(shown.dlq_copy["original_payload"]) == {"total": -1}
    assert [(a.attempt, a.error) for a in shown.failed_attempts] == [(1, "boom")]
