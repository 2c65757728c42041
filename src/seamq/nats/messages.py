"""Reading a message back from a stream by its sequence (the MessageStore port): dead-letter copies,
and originals too big to travel inside them. nats-py's errors stay here."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from seamq.ports import StoredMessage


class JsMessageStore:
    def __init__(self, js: JetStreamContext) -> None:
        self.js = js

    async def get(self, stream: str, seq: int) -> StoredMessage | None:
        try:
            raw = await self.js.get_msg(stream, int(seq))
        except NotFoundError:
            return None
        return StoredMessage(raw.subject or "", dict(raw.headers or {}), raw.data or b"")

    async def delete(self, stream: str, seq: int) -> bool:
        """Remove it; False when it was gone already (max_age, or an earlier purge)."""
        try:
            return bool(await self.js.delete_msg(stream, int(seq)))
        except NotFoundError:
            return False
