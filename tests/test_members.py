"""The processes of one consumer count each other (seamq.nats.members): an unpartitioned consumer
takes every gap in its deliveries for a loss only while it is alone."""

from __future__ import annotations

import asyncio

from seamq.nats.connect import connect
from seamq.nats.members import COUNT_EVERY, Roll, members
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
