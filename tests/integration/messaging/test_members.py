"""The processes of one consumer count each other (seamq.nats.members): an unpartitioned consumer
takes every gap in its deliveries for a loss only while it is alone."""

from __future__ import annotations

import asyncio

from seamq.nats.connect import connect
from seamq.nats import members as roll
from seamq.nats.members import COUNT_EVERY, Roll, members, subject
from seamq.settings import NatsSettings

from helpers import wait_for


async def test_a_process_is_alone_until_another_asks_and_alone_again_once_it_is_gone(nats_server):
    first_nc, second_nc = [await connect(NatsSettings(url=nats_server.url), name=f"members-{n}") for n in (1, 2)]
    told, second_told = [], []
    try:
        first = await Roll(first_nc, "c", changed=told.append).start()
        assert told == [True] and first.count == 1
        second = await Roll(second_nc, "c", changed=second_told.append).start()
        # The first takes the newcomer's ask as "not alone" at once: before the newcomer pulls.
        await wait_for(lambda: told == [True, False], timeout=10, what="the first told of the newcomer")
        await wait_for(lambda: second_told[-1:] == [False], timeout=10, what="the newcomer counting the first")
        assert len(await members(first_nc, "c")) == 2
        await second.close()
        await second_nc.close()
        await wait_for(lambda: told == [True, False, True], timeout=10 * COUNT_EVERY, what="alone again")
        for _ in range(10):  # the console's looks are no newcomer
            [answer] = await members(first_nc, "c")
            assert answer["id"] == first.me
            await asyncio.sleep(COUNT_EVERY / 5)
        assert told == [True, False, True] and first.alone
        await first.close()
    finally:
        await first_nc.close()
        if not second_nc.is_closed:
            await second_nc.close()


async def test_one_answer_late_is_no_process_gone(nats_server, monkeypatch):
    """A busy machine delays one round's answer past COUNT_WAIT: the count keeps the other process
    (alone would take its deliveries for losses); two rounds without it, and it is gone."""
    # Every other round's answer must come within a round's wait, the late one after it: on a busy
    # machine 0.2 s (COUNT_WAIT) was once too short for one that was not meant to be late.
    wait = 1.0
    monkeypatch.setattr(roll, "COUNT_WAIT", wait)
    first_nc, other_nc = [await connect(NatsSettings(url=nats_server.url), name=f"late-{n}") for n in (1, 2)]
    told, rounds, late = [], [], asyncio.Event()

    async def answer(msg) -> None:  # another process, which answers the second count late and then leaves
        if not msg.reply:
            return
        rounds.append(msg.reply)
        if len(rounds) == 3:
            await asyncio.sleep(wait * 2.5)  # after its round, before the next (COUNT_EVERY)
            late.set()
        if len(rounds) <= 3:
            await other_nc.publish(msg.reply, b'{"process": "other", "id": "other"}')

    try:
        await other_nc.subscribe(subject("c"), cb=answer)
        await other_nc.flush()  # the server has the subscription before the first count asks
        first = await Roll(first_nc, "c", changed=told.append).start()
        # Its first answer may itself come late on a busy machine (alone, then two): what counts is
        # that the round meant to be late changes nothing.
        await wait_for(lambda: first.count == 2, timeout=10 * COUNT_EVERY, what="the other process counted")
        assert told[-1] is False, told
        seen = list(told)
        await wait_for(lambda: late.is_set(), timeout=10 * COUNT_EVERY, what="the late answer")
        assert told == seen and first.count == 2, "one late answer took for a process gone"
        await wait_for(lambda: told == [*seen, True], timeout=10 * COUNT_EVERY, what="gone after two rounds")
        assert len(rounds) >= 4  # the late round and one more
        await first.close()
    finally:
        await first_nc.close()
        await other_nc.close()
