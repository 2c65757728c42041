"""Partitioned consumption: one process at a time handles a partition, any number share them.

With several processes on one durable consumer, JetStream hands each message
to whichever process pulls, so one aggregate's messages are handled by two
processes at once and out of order. A partitioned consumer is N durable
consumers (`{name}-p{k}`, topology `partitions: N`), each filtered on the
aggregate buckets the relay puts in the subject, and each in a JetStream
priority group with the `pinned_client` policy: the server gives a partition's
messages to one pinned process, and pins another when that one stops pulling
for `pinned_ttl`. Every process pulls every partition; the ones not pinned
wait as standbys.

Pinning is not exclusivity (ADR-42 says so): when the pin moves, what the old
owner was given and has not acked is still pending, and comes back only after
ack_wait (or its NAK delay), when the new owner may already hold later
messages of the same aggregates. So a process that gains a partition holds
what it receives (sending "in progress" so it does not expire) until every
message the server counts as pending is in its hands: the old owner's leftovers
have come back to it, or were acked by an old owner still alive. Then it hands
them on in stream order, and from there the consumer's own rules keep order.
A failover costs pinned_ttl + ack_wait, never the order. A process stopping
cleanly finishes and acks what it has, then unpins: the next one starts at once.

Counting is sound only if nothing held is already acked: a message that came to
the new owner again (its old delivery expired while the old owner, alive, was
slow) may then be acked by the old owner, and count as held while it is no
longer pending (seen in the soak: a takeover that waited forever, holding 344
with 0 pending, and one aggregate handled out of order when such a message
made the counts meet while an earlier one was still away). So the new owner
opens only when no other process says it has messages of the partition out
(the count answer names them), and, if it holds messages that came again,
after giving everything it holds back once from then on: what comes back is
exactly what is still pending. Holding more than the server counts pending
proves the same and is met the same way.

The server pins whichever process asks first, so the first process to start
would take every partition. The processes of one consumer count each other
(seamq.nats.members), and each keeps its share, ceil(N / processes): it asks
for a partition it does not have only while it has fewer, and one with more
than its share gives one back the clean way (stops asking, lets its lanes ack
what they have, unpins). When a process dies the others' share grows and they
ask again.

While pinned, a partition's pull is the only one the server sends that
partition's messages to, so every gap in its delivery sequence under one pin
is a loss (seamq.nats.gaps, as for a process alone on its consumer); a new
pin starts the count again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Awaitable, Callable, Iterable

from nats.aio.client import Client

from seamq.nats import jsapi
from seamq.nats.members import Roll, members
from seamq.nats.pull import JsDelivery, PullSource
from seamq.observability import log
from seamq.ports import StoredMessage
from seamq.stopping import wait_event
from seamq.topology import ConsumerSpec

GROUP = "seamq"  # the one priority group of every partition consumer
CHECK_EVERY = 0.2  # seconds between two looks at the consumer state while a handover waits


def counted(held: Iterable[JsDelivery], delivered: int) -> int:
    """How many of the deliveries we hold one look at the consumer counts (`delivered`: its last
    consumer sequence then): those that reached us after that look are not in its count."""
    return sum(1 for delivery in held if delivery.consumer_seq <= delivered)


class Partition:
    """One partition consumer: its pinned pull, the handover gate, and what we have out."""

    def __init__(self, nc: Client, stream: str, durable: str, *, buffer: int, ack_wait: float, pinned_ttl: float,
                 arrived: asyncio.Event, others_busy: Callable[[str], Awaitable[bool]], gaps: bool = False) -> None:
        """`others_busy(durable)`: whether another process says it has messages of this partition out."""
        self.nc, self.stream, self.durable, self.others_busy = nc, stream, durable, others_busy
        self.ack_wait, self.pinned_ttl = ack_wait, pinned_ttl
        self.pull = PullSource(nc, stream, durable, buffer=buffer, group=GROUP, arrived=arrived, deliveries=True,
                               gaps=gaps, alone=True)  # alone while pinned
        self.owner: str | None = None  # the pin we handle messages under
        self.open = False  # handover done: messages go straight on
        self.held: dict[int, JsDelivery] = {}  # stream seq -> latest delivery, while the handover waits
        self.ready: deque[JsDelivery] = deque()
        self.out = 0  # handed to the consumer, not yet acked or naked
        self.releasing = False
        self.resting_until = 0.0  # given back: let another process take it
        self._checked = self._touched = 0.0
        self._lost = 0
        self._verified = False  # what we hold was given back once while no other process had any out

    async def start(self) -> "Partition":
        await self.pull.start()
        return self

    def _settled(self) -> None:
        self.out -= 1

    async def take(self, limit: int) -> list[JsDelivery]:
        """Up to `limit` deliveries this process may handle now."""
        if self.pull.unpinned != self._lost:  # the server moved the pin away: give back what we hold
            self._lost = self.pull.unpinned
            await self._release("pin lost")
        for delivery in self.pull.take():  # counted out (`_settled` on its ack or nak) once handed on, not held
            pin = delivery.headers.get("Nats-Pin-Id")
            if pin and pin != self.owner:
                self.owner, self.open, self._verified = pin, False, False
                log.info("partition_pinned", consumer=self.durable)
            if self.open:
                self.ready.append(delivery)
            else:
                self.held[delivery.seq] = delivery
        if not self.open and self.owner is not None:
            await self._handover()
        out = []
        while self.ready and len(out) < limit:
            out.append(self.ready.popleft())
            out[-1].settled = self._settled
        self.out += len(out)
        if self.releasing and not self.ready and not self.out and self.pull.idle:
            await self._unpin()
        return out

    async def _handover(self) -> None:
        now = time.monotonic()
        if now - self._touched > self.ack_wait / 3:  # what we hold must not expire while we wait
            self._touched = now
            for delivery in self.held.values():
                try:
                    await delivery.in_progress()
                except Exception:
                    pass
        if now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        try:
            info = await self._info()
        except Exception as exc:  # the broker is away: look again later
            log.warning("partition_info_failed", consumer=self.durable, error=str(exc))
            return
        ack_pending, delivered = info.get("num_ack_pending", 0), info.get("delivered", {}).get("consumer_seq", 0)
        in_hand = counted(self.held.values(), delivered)
        if in_hand > ack_pending:  # some of what we hold was acked by its old owner: take again what is not
            return await self._give_back_held(f"holds {in_hand}, {ack_pending} pending")
        if in_hand < ack_pending:
            if now - self._touched < CHECK_EVERY:  # said once per touch, not per look
                log.info("partition_waiting_for_previous_owner", consumer=self.durable,
                         not_back=ack_pending - in_hand, ack_wait=self.ack_wait)
            return
        if await self.others_busy(self.durable):  # an old owner alive may still ack what came to us
            self._verified = False
            if now - self._touched < CHECK_EVERY:  # said once per touch, not per look
                log.info("partition_waiting_for_previous_owner", consumer=self.durable, not_back=0, busy=True)
            return
        if not self._verified and any(d.delivered > 1 for d in self.held.values()):
            self._verified = True  # nobody else has any out: what comes back now is exactly what is pending
            return await self._give_back_held("came again: verify it is still pending")
        self.ready.extend(self.held[seq] for seq in sorted(self.held))
        log.info("partition_taken_over", consumer=self.durable, held=len(self.held))
        self.held.clear()
        self.open = True

    async def _give_back_held(self, why: str, event: str = "partition_held_given_back") -> None:
        """Back to the server: while we are pinned it comes to us again at once (only what is still
        pending does), else to the current owner."""
        if self.held:
            log.info(event, consumer=self.durable, held=len(self.held), reason=why)
        for delivery in self.held.values():
            try:
                await delivery.nak()
            except Exception:
                pass
        self.held.clear()

    def want(self, wanted: bool) -> None:
        """Ask for this partition, or stop asking (a partition we own is given back cleanly)."""
        if wanted:
            if not self.releasing and time.monotonic() >= self.resting_until:
                self.pull.paused = False
        elif self.owner is not None:
            if not self.releasing:
                log.info("partition_giving_back", consumer=self.durable)
            self.releasing = self.pull.paused = True
        else:
            self.pull.paused = True

    async def _unpin(self) -> None:
        """Everything we took is settled: unpin, so a standby takes it now, not after pinned_ttl."""
        owner = self.owner
        await self._release("given back")
        await self._unpin_if(owner)
        self.pull.pin = None  # asked for again later, that is a new pin: no stale one on the requests
        self.releasing = False
        self.resting_until = time.monotonic() + self.pinned_ttl

    async def _unpin_if(self, owner: str | None) -> None:
        """Unpin, unless the server already pinned someone else (the unpin API names no pin:
        it would cut off the new owner)."""
        try:
            info = await self._info()
            pinned = [g.get("pinned_client_id") for g in info.get("priority_groups") or [] if g.get("group") == GROUP]
            if owner and pinned == [owner]:
                await jsapi.call(self.nc, f"CONSUMER.UNPIN.{self.stream}.{self.durable}", {"group": GROUP}, timeout=2)
        except Exception:  # the pin then moves after pinned_ttl, as after a crash
            pass

    async def _info(self) -> dict:
        return await jsapi.call(self.nc, f"CONSUMER.INFO.{self.stream}.{self.durable}", timeout=2) or {}

    async def _release(self, why: str) -> None:
        """Give back what the handover held (the current owner gets it at once), and the pin's claim."""
        await self._give_back_held(why, "partition_released")
        self.owner, self.open = None, False

    async def close(self, *, unpin: bool) -> None:
        owner = self.owner if self.open else None
        await self._release("stopping")
        await self.pull.close()
        if unpin and owner:
            await self._unpin_if(owner)


class PartitionedDeliveries:
    """The consumer's DeliverySource over all partitions of one consumer, keeping this process's share."""

    def __init__(self, nc: Client, spec: ConsumerSpec, *, buffer: int, gaps: bool = False) -> None:
        """`gaps`: find deliveries lost on the way (seamq.nats.gaps), for an ordered consumer."""
        self.nc = nc
        self._arrived = asyncio.Event()
        self.partitions = [Partition(nc, spec.stream, durable, buffer=buffer, ack_wait=spec.ack_wait,
                                     pinned_ttl=spec.pinned_ttl, arrived=self._arrived, others_busy=self._others_busy,
                                     gaps=gaps)
                           for durable in spec.durables()]
        self.roll = Roll(nc, spec.name, says=lambda: {"holds": self.holding(), "busy": self.busy()})
        self._next = 0

    async def start(self) -> "PartitionedDeliveries":
        for partition in self.partitions:
            await partition.start()
        await self.roll.start()
        return self

    def holding(self) -> list[str]:
        return [p.durable for p in self.partitions if p.owner is not None and not p.releasing]

    def busy(self) -> list[str]:
        """The partitions of which this process has messages it may still ack."""
        return [p.durable for p in self.partitions if p.out or p.ready or p.pull.buffered]

    async def _others_busy(self, durable: str) -> bool:
        return any(m.get("id") != self.roll.me and durable in (m.get("busy") or [])
                   for m in await members(self.nc, self.roll.consumer))

    def _balance(self) -> None:
        share = math.ceil(len(self.partitions) / self.roll.count)
        owned = [p for p in self.partitions if p.owner is not None and not p.releasing]
        if len(owned) > share:  # give one back per look, the one with the least in hand
            min(owned, key=lambda p: p.out + len(p.ready)).want(False)
        for partition in self.partitions:
            if partition.owner is None:
                partition.want(len(owned) < share)
            elif not partition.releasing:
                partition.want(True)

    async def fetch(self, batch: int, timeout: float) -> list[JsDelivery]:
        deadline = time.monotonic() + timeout
        while True:
            self._arrived.clear()
            self._balance()
            out: list[JsDelivery] = []
            count = len(self.partitions)
            for i in range(count):  # round robin, so no partition starves the others
                out += await self.partitions[(self._next + i) % count].take(batch - len(out))
                if len(out) >= batch:
                    break
            self._next = (self._next + 1) % count
            if out or self.drained:
                return out
            for partition in self.partitions:
                await partition.pull.top_up()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            busy = any((p.owner and not p.open) or p.releasing for p in self.partitions)
            await wait_event(self._arrived, min(remaining, CHECK_EVERY if busy else 1.0))

    def missed(self) -> list[StoredMessage]:
        return [m for partition in self.partitions for m in partition.pull.missed()]

    def resumed(self) -> float | None:
        return max((at for at in [p.pull.resumed() for p in self.partitions] if at is not None), default=None)

    def stop_requesting(self) -> None:
        for partition in self.partitions:
            partition.pull.stop_requesting()

    @property
    def drained(self) -> bool:
        return all(p.pull.drained and not p.ready for p in self.partitions)

    async def close(self) -> None:
        """After the consumer's lanes are done (all acked): unpin what we own, when cleanly stopped."""
        await self.roll.close()
        drained = self.drained
        for partition in self.partitions:
            await partition.close(unpin=drained)
