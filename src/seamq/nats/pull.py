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

EXPIRES = 2.0  # seconds a pull request stands; bounds how long a clean stop can take


class PullSource:
    """Several processes may share one durable consumer; each keeps its own pull."""

    def __init__(self, nc: Client, stream: str, durable: str, *, buffer: int = 1000) -> None:
        self.nc, self.stream, self.durable = nc, stream, durable
        self.buffer = max(1, buffer)
        self._subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._ready: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._requested = 0  # asked for, not yet arrived nor expired
        self._requested_at = 0.0
        self._sub = None
        self._inbox = ""
        self._stopping = False

    async def start(self) -> "PullSource":
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)
        return self

    async def _on_message(self, msg: Msg) -> None:
        if msg.data or not msg.headers or "Status" not in msg.headers:
            self._ready.append(msg)
            self._requested -= 1
            self._arrived.set()
            return
        status = msg.headers.get("Status")
        if status in ("404", "408", "409"):  # request expired, nothing left, or the server ended it
            left = msg.headers.get("Nats-Pending-Messages")
            self._requested = max(0, self._requested - int(left)) if left else 0
            self._arrived.set()  # let fetch() top the pull up again

    def stop_requesting(self) -> None:
        self._stopping = True

    @property
    def drained(self) -> bool:
        """Stopping, nothing buffered, and no request that could still deliver."""
        self._expire()
        return self._stopping and not self._ready and self._requested <= 0

    def _expire(self) -> None:
        if time.monotonic() - self._requested_at > EXPIRES + 0.5:
            self._requested = 0  # every request has expired by now (also after a reconnect)

    async def _top_up(self) -> None:
        self._expire()
        if self._stopping:
            return
        now = time.monotonic()
        want = self.buffer - self._requested - len(self._ready)
        if want >= self.buffer // 2 or (want > 0 and not self._requested):
            request = {"batch": want, "expires": int(EXPIRES * 1e9)}
            await self.nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)
            self._requested += want
            self._requested_at = now

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages; an empty list when none came within `timeout`."""
        if self._sub is None:
            raise RuntimeError("PullSource.start() was not awaited")
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self.drained:
                return []
            self._arrived.clear()
            await self._top_up()
            if self._ready:  # arrived while we were topping up
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            try:
                await asyncio.wait_for(self._arrived.wait(), min(remaining, 1.0))
            except asyncio.TimeoutError:
                pass
        count = min(batch, len(self._ready))
        out = [self._ready.popleft() for _ in range(count)]
        await self._top_up()
        return out

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        while self._ready:  # only when closed without draining: give them back now
            try:
                await self._ready.popleft().nak()
            except Exception:
                pass


class JsDelivery:
    """A JetStream message as the consumer port's Delivery: its metadata parsed once, here."""

    __slots__ = ("subject", "headers", "data", "delivered", "stream", "seq", "_msg")

    def __init__(self, msg: Msg) -> None:
        meta = msg.metadata
        self.subject, self.headers, self.data = msg.subject, msg.headers or {}, msg.data
        self.delivered, self.stream, self.seq = meta.num_delivered, meta.stream, meta.sequence.stream
        self._msg = msg

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        await self._msg.nak(delay=delay)


class Deliveries:
    """A PullSource for the consumer: what it fetches comes out as Deliveries."""

    def __init__(self, pull: PullSource) -> None:
        self.pull = pull

    async def fetch(self, batch: int, timeout: float) -> list[JsDelivery]:
        return [JsDelivery(msg) for msg in await self.pull.fetch(batch, timeout)]

    def stop_requesting(self) -> None:
        self.pull.stop_requesting()

    @property
    def drained(self) -> bool:
        return self.pull.drained
