"""Pipelined JetStream publishing.

`js.publish()` waits for each PubAck in turn, and nats-py's own async publish
spends about twice the CPU per message of this approach: one wildcard
subscription on a private inbox receives every PubAck, and a counter in the
reply subject says which message of the batch it acknowledges. A whole batch
goes out before the first ack is awaited, so one round trip serves hundreds
of messages, and no per-message future is created. Messages go out through
seamq.nats.wire (headers encoded once, not by nats-py per publish).
"""

from __future__ import annotations

import asyncio
import json

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from seamq.nats.connect import connect
from seamq.nats.wire import Wire, header_block
from seamq.ports import OutMessage, PubResult
from seamq.republish import republish
from seamq.model import describe


class _InFlight:
    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.results: list[PubResult | None] = [None] * size
        self.missing = size
        self.complete = asyncio.Event()

    def settle(self, index: int, result: PubResult) -> None:
        if 0 <= index < len(self.results) and self.results[index] is None:
            self.results[index] = result
            self.missing -= 1
            if self.missing == 0:
                self.complete.set()


class PipelinedPublisher:
    def __init__(self, nc: Client, *, timeout: float = 5.0) -> None:
        self._nc = nc
        self._wire = Wire(nc)
        self._timeout = timeout
        self._prefix = nc.new_inbox() + "."
        self._next = 0
        self._batches: list[_InFlight] = []
        self._sub = None

    async def start(self) -> "PipelinedPublisher":
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_ack)
        return self

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_ack(self, msg: Msg) -> None:
        number = int(msg.subject[len(self._prefix):])
        for batch in self._batches:  # one or two batches are ever in flight
            batch.settle(number - batch.base, _parse_ack(msg))

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]:
        """Publish all, then wait for every ack; results are in input order.

        A message whose ack does not come within the timeout is reported as
        failed; republishing it is safe because its Nats-Msg-Id deduplicates.
        Messages of one key go out in waves, the next only once the one before
        it is stored: sent together, a later one can be stored while an
        earlier one is lost (a stream leader that fails between them, a
        message the stream refuses). Not sent after a failure: `held`.
        """
        if self._sub is None:
            raise RuntimeError("PipelinedPublisher.start() was not awaited")
        results: list[PubResult] = [HELD] * len(messages)
        stopped: set[tuple[str, ...]] = set()  # keys with a message not stored
        for wave in _waves(messages):
            sendable = [i for i in wave if messages[i].key not in stopped]
            for i, result in zip(sendable, await self._pipeline([messages[i] for i in sendable])):
                results[i] = result
                if not result.ok and (key := messages[i].key) is not None:
                    stopped.add(key)
            if any(results[i].transport for i in sendable):
                break  # the broker is away: the next wave would only wait as long again
        return results

    async def _pipeline(self, messages: list[OutMessage]) -> list[PubResult]:
        if not messages:
            return []
        batch = _InFlight(self._next, len(messages))
        self._next += len(messages)
        self._batches.append(batch)
        try:
            publish, prefix, base = self._wire.publish, self._prefix, batch.base
            for i, message in enumerate(messages):
                try:
                    await publish(message.subject, message.payload, reply=f"{prefix}{base + i}",
                                  headers=header_block(message.headers))
                except Exception as exc:  # connection closed, payload too big, bad subject
                    batch.settle(i, PubResult(ok=False, error=describe(exc),
                                              transport=isinstance(exc, UNREACHABLE)))
            # No nc.flush(): each publish already kicks nats-py's flusher task,
            # and flush() is a PING/PONG round trip per batch (measured: 6.5%
            # of the relay's CPU at 2k events/s). The acks are the barrier.
            try:
                await asyncio.wait_for(batch.complete.wait(), self._timeout)
            except asyncio.TimeoutError:
                pass
        finally:
            self._batches.remove(batch)
        timeout = PubResult(ok=False, error="timeout waiting for JetStream ack", transport=True)
        return [r if r is not None else timeout for r in batch.results]


def _waves(messages: list[OutMessage]) -> list[list[int]]:
    """Indexes by wave: the n-th message of each key in wave n; messages with no key in the first."""
    waves: list[list[int]] = []
    seen: dict[tuple[str, ...], int] = {}
    for i, message in enumerate(messages):
        n = 0
        if message.key is not None:
            n = seen.get(message.key, 0)
            seen[message.key] = n + 1
        if n == len(waves):
            waves.append([])
        waves[n].append(i)
    return waves


HELD = PubResult(ok=False, held=True, error="an earlier message of its aggregate was not stored")


# Exceptions of a publish that say the broker is unreachable, not that the message is wrong.
UNREACHABLE = (
    nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError, nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError, nats.errors.StaleConnectionError, nats.errors.TimeoutError,
    nats.errors.FlushTimeoutError, asyncio.TimeoutError, ConnectionError,
)

_OK_PREFIX = b'{"stream":"'


def _parse_ack(msg: Msg) -> PubResult:
    data = msg.data
    if not data:
        status = (msg.headers or {}).get("Status", "")
        if status == "503":
            return PubResult(ok=False, error="no stream accepts this subject (503 no responders)")
        return PubResult(ok=False, error=f"empty ack (status {status or 'none'})")
    try:
        body = json.loads(data)
    except ValueError:
        return PubResult(ok=False, error=f"unreadable ack: {data[:100]!r}")
    if "error" in body:
        err = body["error"]
        return PubResult(ok=False, error=f"JetStream error {err.get('err_code') or err.get('code')}: {err.get('description')}")
    return PubResult(ok=True, seq=body.get("seq"), duplicate=bool(body.get("duplicate")))


async def publish_copies(nats, copies, *, name: str, progress=lambda done: None) -> int:
    """One-shot republishing (reconcile repair, lake replay) on a connection of its own, with the
    settings' credentials; returns how many JetStream stored."""
    nc = await connect(nats, name=name, persistent=False)
    publisher = await PipelinedPublisher(nc, timeout=30).start()
    try:
        return sum(result.ok for result in await republish(publisher, copies, progress=progress))
    finally:
        await publisher.close()
        await nc.close()
