"""Pull consumption from a durable JetStream consumer (REQ-056).

`PullSource` keeps a continuous pull: it asks the server for up to `buffer`
messages ahead (pull requests on `$JS.API.CONSUMER.MSG.NEXT`), they arrive on
one private inbox, and `fetch()` hands out what has arrived. nats-py's
`fetch()` makes a request and a fresh wait per batch; a standing request
halves the client CPU per message and removes a round trip from the latency.
The buffer is small (about two batches). To stop cleanly, call
`stop_requesting()` and keep fetching until `drained`: what the standing
request still delivers gets processed and ACKed instead of waiting out
ack_wait on the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque

from nats.aio.client import Client
from nats.aio.msg import Msg

from seamq.nats.gaps import Gaps
from seamq.nats.members import Roll
from seamq.ports import StoredMessage
from seamq.stopping import wait_event

EXPIRES = 2.0  # seconds a pull request stands; bounds how long a clean stop can take


class PullSource:
    """Several processes may share one durable consumer; each keeps its own pull.

    With a priority `group` (a partition consumer, seamq.nats.partitions) the pull
    requests carry the pin the server gave us, and `unpinned` counts the times the
    server said our pin is no longer the one.
    """

    def __init__(self, nc: Client, stream: str, durable: str, *, buffer: int = 1000, group: str | None = None,
                 arrived: asyncio.Event | None = None, deliveries: bool = False, gaps: bool = False,
                 alone: bool = False) -> None:
        """`deliveries`: hand out JsDelivery, parsed once as it arrives, instead of nats-py's Msg; `gaps`:
        find the deliveries lost on the way (seamq.nats.gaps; an ordered consumer needs them; implies
        `deliveries`); `alone`: no other process pulls from this consumer."""
        self.nc, self.stream, self.durable = nc, stream, durable
        self.buffer = max(1, buffer)
        self.group = group
        self.pin: str | None = None
        self.unpinned = 0
        self._subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.deliveries = deliveries or gaps
        self._ready: deque = deque()  # JsDelivery or Msg
        self._arrived = arrived or asyncio.Event()  # shared by all partitions of a consumer
        self._requested = 0  # asked for, not yet arrived nor expired
        self._requested_at = 0.0
        self._reconnects = nc.stats["reconnects"]
        self._sub = None
        self._inbox = ""
        self._stopping = False
        self.paused = False  # a partition this process does not want now: no new requests
        self.gaps = Gaps(nc, stream, durable, alone=alone) if gaps else None
        self._contact = nc.stats["reconnects"]
        self._unheard = False  # no consumer leader answered a request since the last delivery
        self.resumed_at: float | None = None  # deliveries came again after either (`resumed()`)

    async def start(self) -> "PullSource":
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)
        return self

    async def _on_message(self, msg: Msg) -> None:
        if (reconnects := self.nc.stats["reconnects"]) != self._contact:  # what was on its way is lost
            self._contact, self.resumed_at = reconnects, time.monotonic()
            if self.gaps:
                self.gaps.suspect()
        if msg.data or not msg.headers or "Status" not in msg.headers:
            if self._unheard:  # a leader again: what it is to send again comes within ack_wait from now
                self._unheard, self.resumed_at = False, time.monotonic()
            pin = self.group and msg.headers and msg.headers.get("Nats-Pin-Id")
            if pin and pin != self.pin:
                self.pin = pin
                if self.gaps:  # what the server sent others before this pin is no gap of ours
                    self.gaps.restart()
            item = JsDelivery(msg) if self.deliveries else msg
            if self.gaps:  # before it is handed on: the lost ones must hold their aggregates first
                await self.gaps.seen(item.seq, item.consumer_seq)
            self._ready.append(item)
            self._requested -= 1
            self._arrived.set()
            return
        status = msg.headers.get("Status")
        if status == "423":  # Nats-Wrong-Pin-Id: another process is pinned now; pull without a pin
            self.pin = None
            self.unpinned += 1
            if self.gaps:
                self.gaps.restart()
        if status == "409" and "leadership" in (msg.headers.get("Description") or "").lower():
            self._unheard = True  # the consumer's leader changed: a NAK it had, or its redelivery, may be lost
        if status in ("404", "408", "409", "423"):  # request expired, nothing left, the server ended it, unpinned
            left = msg.headers.get("Nats-Pending-Messages")
            self._requested = max(0, self._requested - int(left)) if left else 0
            self._arrived.set()  # let fetch() top the pull up again
        elif status == "503":
            # No responders: the request reached no consumer leader (an election, or a new leader's interest
            # not yet known on our route), so nothing will come for it. fetch() asks again within a second,
            # not after the request's expiry, and not at once, which would spin while there is no leader.
            self._requested, self._unheard = 0, True
            if self.gaps:
                self.gaps.suspect()

    def stop_requesting(self) -> None:
        self._stopping = True

    @property
    def drained(self) -> bool:
        """Stopping, nothing buffered, and no request that could still deliver."""
        return self._stopping and self.idle

    @property
    def buffered(self) -> int:
        """Messages arrived and not yet taken."""
        return len(self._ready)

    @property
    def idle(self) -> bool:
        """Nothing buffered, and no request that could still deliver."""
        self._expire()
        return not self._ready and self._requested <= 0

    def _expire(self) -> None:
        reconnects = self.nc.stats["reconnects"]
        if reconnects != self._reconnects or time.monotonic() - self._requested_at > EXPIRES + 0.5:
            # Every request has expired by now, or went with the connection: ask again at once.
            if self._requested > 0:  # unanswered: the consumer leader, or the way to it, went
                self._unheard = True
                if self.gaps:
                    self.gaps.suspect()
            self._requested, self._reconnects = 0, reconnects

    async def top_up(self) -> None:
        self._expire()
        if self._stopping or self.paused:
            return
        now = time.monotonic()
        want = self.buffer - self._requested - len(self._ready)
        if want > 0 and (want >= self.buffer // 2 or not self._requested):
            request = {"batch": want, "expires": int(EXPIRES * 1e9)}
            if self.group:
                request["group"] = self.group
                if self.pin:
                    request["id"] = self.pin
            await self.nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)
            self._requested += want
            self._requested_at = now

    async def fetch(self, batch: int, timeout: float) -> list:
        """Up to `batch` messages; an empty list when none came within `timeout`."""
        if self._sub is None:
            raise RuntimeError("PullSource.start() was not awaited")
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self.drained:
                return []
            self._arrived.clear()
            await self.top_up()
            if self._ready:  # arrived while we were topping up
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await wait_event(self._arrived, min(remaining, 1.0))
        count = min(batch, len(self._ready))
        out = [self._ready.popleft() for _ in range(count)]
        await self.top_up()
        return out

    def resumed(self) -> float | None:
        """When deliveries came again after a reconnect, or after a time when no consumer leader
        answered (no responders, a leadership change, a request never answered), since last asked."""
        at, self.resumed_at = self.resumed_at, None
        return at

    def missed(self) -> list[StoredMessage]:
        """What `gaps` found since last asked."""
        if not self.gaps:
            return []
        found, self.gaps.found = self.gaps.found, []
        return found

    def take(self) -> list:
        """Whatever has arrived, without waiting (the caller tops up and waits on `arrived`)."""
        out = list(self._ready)
        self._ready.clear()
        return out

    async def close(self, *, give_back: bool = True) -> None:
        """`give_back`: NAK what arrived and was not taken (a consumer that needs no acks: drop it)."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        if not give_back:
            self._ready.clear()
        while self._ready:  # only when closed without draining: give them back now
            try:
                await self._ready.popleft().nak()
            except Exception:
                pass


def ack_fields(msg: Msg) -> tuple[str, int, int, int, int]:
    """(stream, times delivered, stream seq, consumer seq, messages pending after it) from the ack subject.

    What nats-py's `msg.metadata` gives, without its dataclasses and timestamp (a tenth
    of the time): `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`,
    or with `<domain>.<account hash>` after `$JS.ACK` and a token at the end."""
    tokens = (msg.reply or "").split(".")
    if tokens[:2] == ["$JS", "ACK"] and len(tokens) in (9, 11, 12):
        at = 2 if len(tokens) == 9 else 4
        try:
            return tokens[at], int(tokens[at + 2]), int(tokens[at + 3]), int(tokens[at + 4]), int(tokens[at + 6])
        except ValueError:
            pass
    meta = msg.metadata  # anything else: nats-py's reading, or its error
    return meta.stream, meta.num_delivered, meta.sequence.stream, meta.sequence.consumer, meta.num_pending


class JsDelivery:
    """A JetStream message as the consumer port's Delivery: its metadata parsed once, here."""

    __slots__ = ("subject", "headers", "data", "delivered", "stream", "seq", "consumer_seq", "pending", "_msg",
                 "settled")

    def __init__(self, msg: Msg, settled=None) -> None:
        """`settled`: called once the message is acked or naked (a partition counts what it has out)."""
        self.subject, self.headers, self.data = msg.subject, msg.headers or {}, msg.data
        self.stream, self.delivered, self.seq, self.consumer_seq, self.pending = ack_fields(msg)
        self._msg = msg
        self.settled = settled

    async def ack(self) -> None:
        try:
            await self._msg.ack()
        finally:
            if self.settled:
                self.settled()

    async def nak(self, delay: float | None = None) -> None:
        try:
            await self._msg.nak(delay=delay)
        finally:
            if self.settled:
                self.settled()

    async def in_progress(self) -> None:
        await self._msg.in_progress()


class Deliveries:
    """A PullSource for the consumer: what it fetches comes out as Deliveries."""

    def __init__(self, pull: PullSource, roll: Roll | None = None) -> None:
        if not pull.deliveries:
            raise ValueError("Deliveries needs a PullSource(deliveries=True)")
        self.pull, self.roll = pull, roll

    @classmethod
    async def open(cls, nc: Client, stream: str, durable: str, *, buffer: int, ordered: bool,
                   alone: bool | None = None) -> "Deliveries":
        """An unpartitioned consumer's deliveries. `ordered`: lost ones are looked for (seamq.nats.gaps),
        after a fault, or at every gap while this process is `alone` on its consumer: None to count
        the processes (seamq.nats.members), which it then does before its first pull."""
        pull = PullSource(nc, stream, durable, buffer=buffer, deliveries=True, gaps=ordered, alone=bool(alone))
        roll = None
        if pull.gaps:
            roll = await Roll(nc, durable, changed=pull.gaps.set_alone if alone is None else _told).start()
        return cls(await pull.start(), roll)

    async def fetch(self, batch: int, timeout: float) -> list[JsDelivery]:
        return await self.pull.fetch(batch, timeout)

    def missed(self) -> list[StoredMessage]:
        return self.pull.missed()

    def resumed(self) -> float | None:
        return self.pull.resumed()

    def stop_requesting(self) -> None:
        self.pull.stop_requesting()

    @property
    def drained(self) -> bool:
        return self.pull.drained

    async def close(self) -> None:
        if self.roll:
            await self.roll.close()
        await self.pull.close()


def _told(alone: bool) -> None:
    """`consumer.alone` set: the count is not asked."""
