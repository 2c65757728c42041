"""Pull consumption from a durable JetStream consumer (REQ-056)."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext


class PullSource:
    """Fetch batches from a durable consumer; several processes may share one."""

    def __init__(self, js: JetStreamContext, stream: str, durable: str) -> None:
        self.js, self.stream, self.durable = js, stream, durable
        self._sub = None

    async def start(self) -> "PullSource":
        self._sub = await self.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        return self

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages; an empty list when none came within `timeout`."""
        try:
            return await self._sub.fetch(batch, timeout=timeout)
        except (NatsTimeoutError, asyncio.TimeoutError):
            return []

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
