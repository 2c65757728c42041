"""The processes of one consumer count each other over NATS.

Each process answers requests on `_SEAMQ.MEMBERS.{consumer}` with what it says
of itself (a partitioned consumer: the partitions it holds, which the console
shows), and counts the answers every COUNT_EVERY seconds; a process is
taken for gone when two counts in a row miss it. A partitioned
consumer keeps its share of the partitions by that count. An unpartitioned one
learns from it whether it is alone on its durable consumer: then a gap in its
deliveries is a loss (seamq.nats.gaps), with or without a fault it saw. A
process asks once before it starts pulling, and the others take that request
from a newcomer as "not alone" at once, before its first delivery can show
them a gap that is not a loss.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Callable

from nats.aio.client import Client

COUNT_EVERY = 2.0  # seconds between two counts of the consumer's processes
COUNT_WAIT = 0.2  # seconds a count waits for answers
PROCESS = f"{socket.gethostname()} pid {os.getpid()}"  # how a process names itself to the others


def subject(consumer: str) -> str:
    return f"_SEAMQ.MEMBERS.{consumer}"


async def members(nc: Client, consumer: str, wait: float = COUNT_WAIT, *, asking: bytes = b"") -> list[dict]:
    """The processes of a consumer that answer now, each with what it says of itself."""
    inbox, found = nc.new_inbox(), []

    async def answered(msg) -> None:
        try:
            found.append(json.loads(msg.data))
        except ValueError:  # a process of an older seamq answers with nothing
            found.append({"process": "?", "holds": []})

    sub = await nc.subscribe(inbox, cb=answered)
    try:
        await nc.publish(subject(consumer), asking, reply=inbox)
        await asyncio.sleep(wait)
    finally:
        await sub.unsubscribe()
    return sorted(found, key=lambda m: str(m.get("process")))


class Roll:
    """This process on its consumer's roll: answers the others, counts them (`count`), and calls
    `changed(alone)` when it finds itself alone or not any more."""

    def __init__(self, nc: Client, consumer: str, says: Callable[[], dict] = dict,
                 changed: Callable[[bool], None] = lambda alone: None) -> None:
        self.nc, self.consumer, self.says, self.changed = nc, consumer, says, changed
        self.me = uuid.uuid4().hex  # how our own answer and request are told from the others'
        self.count = 1
        self._inbox, self._round, self._last_round = nc.new_inbox(), 0, 1
        self._answers: set[str] = set()
        self._own = asyncio.Event()
        self._subs: list = []
        self._counter: asyncio.Task | None = None

    @property
    def alone(self) -> bool:
        return self.count == 1

    async def start(self) -> "Roll":
        async def asked(msg) -> None:
            try:
                asking = json.loads(msg.data)
            except ValueError:  # the console's look, or an older seamq's count
                asking = None
            if isinstance(asking, dict) and asking.get("pulls") and asking.get("id") != self.me:
                # A newcomer, before its first pull; heard as a round that saw it, so that one next
                # round without its answer (it is still starting) is no process gone.
                self._last_round = max(self._last_round, 2)
                self._set(max(self.count, 2))
            if msg.reply:
                await msg.respond(json.dumps({"process": PROCESS, **self.says(), "id": self.me}).encode())

        self._subs.append(await self.nc.subscribe(subject(self.consumer), cb=asked))
        self._subs.append(await self.nc.subscribe(f"{self._inbox}.*", cb=self._answered))
        self.count = self._last_round = await self._count_once() or 1
        self.changed(self.alone)
        self._counter = asyncio.create_task(self._count())
        return self

    async def _answered(self, msg) -> None:
        if msg.subject != f"{self._inbox}.{self._round}":  # a late answer to an earlier count
            return
        try:
            who = json.loads(msg.data).get("id")
        except (ValueError, AttributeError):  # a process of an older seamq
            who = None
        self._answers.add(who or f"? {len(self._answers)}")
        if who == self.me:
            self._own.set()

    async def _count_once(self) -> int | None:
        """The processes that answer this round; None when our own answer did not come back (we
        are cut off from the broker, or it is slow): a round waits for it, then COUNT_WAIT more for
        the others, whose answers travel the same way."""
        self._round += 1
        self._answers, self._own = set(), asyncio.Event()
        await self.nc.publish(subject(self.consumer), json.dumps({"id": self.me, "pulls": True}).encode(),
                              reply=f"{self._inbox}.{self._round}")
        try:
            await asyncio.wait_for(self._own.wait(), COUNT_EVERY)
        except asyncio.TimeoutError:
            return None
        await asyncio.sleep(COUNT_WAIT)
        return len(self._answers)

    def _set(self, count: int) -> None:
        was, self.count = self.alone, count
        if self.alone != was:
            self.changed(self.alone)

    async def _count(self) -> None:
        while True:
            try:
                count = await self._count_once()
                if count:  # else keep the last count
                    # Fewer believed from two rounds in a row: one answer late by more than COUNT_WAIT
                    # on a busy machine is no process gone (alone would take the others' deliveries
                    # for losses; a partition's share, every partition).
                    self._set(max(count, self._last_round))
                    self._last_round = count
            except Exception:  # the broker is away: keep the last count
                pass
            await asyncio.sleep(COUNT_EVERY)

    async def close(self) -> None:
        if self._counter:
            self._counter.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
