"""Deliveries lost on the way: which stream messages the server sent us that never arrived.

A pull delivery travels once. When the connection drops, or the route to the
consumer leader is cut, what was in flight is gone, and JetStream sends it
again only when ack_wait runs out. Meanwhile later messages of the same
aggregates arrive and would be handled first (seen in the partitions lab: a
consumer cut off handled an order's 192nd event before its 191st). The
consumer holds an aggregate behind a message it knows is away (seamq.holds);
this module tells it which ones are.

Each delivery carries the consumer's delivery sequence, one higher for every
message the server sends on this consumer. After something that can lose
messages in flight (a reconnect, a pull request the server never answered, no
responders) the next delivery shows whether any was lost: a gap in that
sequence. The lost ones lie above the highest stream sequence we had and at or
below the highest the consumer has sent (its info's `delivered`), so they are
read back from the stream there, under the consumer's filter, at once: before
the delivery that showed the gap is handed on. Waiting for more would come too
late. After ack_wait the server sends the lost ones again before anything new,
and not always in stream order (seen in the partitions lab: an order's events
75-80 came back before its 74, in one lane, and were handled first), so each
aggregate must wait for its lost ones before any of them comes back.
Redeliveries lost the same way are of messages we had already: they hold their
aggregates from before (seamq.holds' grace). Only after such a fault: processes
sharing one durable consumer see gaps all the time (the others' deliveries),
and a lookup then names their messages too, which costs those aggregates a wait
of up to ack_wait once per fault, not their order. Deliveries can also be lost
with no fault a client sees: a route between two servers that stalls for 10 s
drops what it held (nats-server's "Slow Consumer Detected" on a route; seen in
the partitions lab as an aggregate handled out of order). A process alone on
its durable consumer (counted, seamq.nats.members), or a partition's pull while
pinned, treats every gap as a loss.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client

from seamq.model import describe
from seamq.nats import stream_read
from seamq.observability import log
from seamq.ports import StoredMessage

LOOKUP_FOR = 10.0  # seconds to keep trying to read the lost ones back (deliveries wait meanwhile)
MOST = 2000  # messages read back after one fault at most: a wider range is not one process's in-flight pull


class Gaps:
    """Watches one pull's deliveries; `found` collects the stream messages lost on the way."""

    def __init__(self, nc: Client, stream: str, durable: str, *, alone: bool = False) -> None:
        """`alone`: no other process pulls from this durable consumer, so every gap is a loss, also
        one no fault of ours shows (a route between servers that dropped what it held)."""
        self.nc, self.stream, self.durable, self.alone = nc, stream, durable, alone
        self.found: list[StoredMessage] = []
        self.lookups = 0
        self._suspect = False
        self._last = 0  # delivery sequence of the last delivery
        self._highest = 0  # highest stream sequence delivered to us

    def suspect(self) -> None:
        """Something happened that can lose deliveries in flight: check the next one."""
        self._suspect = True

    def restart(self) -> None:
        """The pull changed hands (a partition's pin): what others were sent is no gap of ours."""
        self._last, self._suspect = 0, False

    def set_alone(self, alone: bool) -> None:
        """The consumer's processes were counted (seamq.nats.members)."""
        if alone and not self.alone:  # the others' deliveries until now are no gap of ours
            self.restart()
        if alone != self.alone:
            log.info("consumer_alone" if alone else "consumer_shared", stream=self.stream, consumer=self.durable,
                     gaps="every one a loss" if alone else "looked at after a fault only")
        self.alone = alone

    async def seen(self, seq: int, consumer_seq: int) -> None:
        """Called for each delivery as it arrives, before it is handed on."""
        if self._suspect or self.alone:
            self._suspect = False
            if self._last and consumer_seq > self._last + 1:
                await self._read_back(self._highest, seq)
        self._last = max(self._last, consumer_seq)
        self._highest = max(self._highest, seq)

    async def _read_back(self, low: int, arrived: int) -> None:
        """The stream's messages under our filter above `low` that the consumer has sent, but for
        `arrived` (the delivery at hand)."""
        self.lookups += 1
        deadline = time.monotonic() + LOOKUP_FOR
        while True:
            try:
                found = [m for m in await self._between(low) if m.seq != arrived]
                break
            except Exception as exc:  # the stream leader is away too: try again, for a while
                if time.monotonic() > deadline:
                    log.error("consumer_missed_unknown", stream=self.stream, consumer=self.durable,
                              after=low, error=describe(exc),
                              effect="their aggregates are not held: they come back after ack_wait, "
                                     "and may be handled after later messages")
                    return
                await asyncio.sleep(0.5)
        if found:
            log.warning("consumer_deliveries_missed", stream=self.stream, consumer=self.durable, count=len(found),
                        seqs=[m.seq for m in found[:20]], then="their aggregates wait for them (up to ack_wait)")
        self.found += found

    async def _between(self, low: int) -> list[StoredMessage]:
        filters, sent = await stream_read.sent_so_far(self.nc, self.stream, self.durable)
        found = await stream_read.between(self.nc, self.stream, low, sent + 1, filters, MOST)
        if len(found) >= MOST:
            log.error("consumer_missed_too_many", stream=self.stream, consumer=self.durable,
                      between=f"{low + 1}-{sent}", held=MOST, effect="only the first ones hold their aggregates")
        return found
