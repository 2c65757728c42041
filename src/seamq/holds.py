"""Per-aggregate order under failures: an aggregate waits behind its failed message.

A failed message is NAKed with a backoff. Later messages of its aggregate must
not overtake it, so the consumer holds them: NAKs them to come back just after
the failed one is due, again while it keeps failing, until it is handled or
dead-lettered. The blocks outlive a lane transaction, since the redelivered
messages arrive in later ones. They live in one consumer process; with several
processes on one durable consumer the failed message may come back to another
process, so a block lapses shortly after its message was due.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

HOLD_MARGIN = 0.05  # a held message comes back this long after the one it waits for
HOLD_GRACE = 1.0  # a block lapses this long after its redelivery was due: it went to another process


@dataclass(frozen=True)
class Block:
    """An aggregate waiting behind its failed message until that one is redelivered."""

    message_id: uuid.UUID
    seq: int  # stream sequence of the failed message
    due: float  # monotonic time its redelivery is due

    @classmethod
    def retry_in(cls, message_id: uuid.UUID, seq: int, delay: float) -> "Block":
        return cls(message_id, seq, time.monotonic() + delay)

    def lapsed(self, now: float) -> bool:
        return now > self.due + HOLD_GRACE


class Holds:
    """aggregate -> the failed message it waits behind, for one consumer process."""

    def __init__(self) -> None:
        self._blocked: dict[str, Block] = {}

    def delay(self, aggregate: str, message_id: uuid.UUID | None, seq: int, last_delivery: bool,
              pending: dict[str, Block]) -> float | None:
        """How long to hold this message (a NAK delay), or None to handle it now.

        `pending` holds the failures of the lane transaction in progress.
        """
        block = pending.get(aggregate) or self._blocked.get(aggregate)
        if block is None or block.message_id == message_id:
            return None
        now = time.monotonic()
        if seq < block.seq or block.lapsed(now):
            return None  # earlier in the stream than the failure, or the block lapsed
        if last_delivery:
            return None  # JetStream would not deliver it again: handle it now, out of order
        return max(0.0, block.due - now) + HOLD_MARGIN

    def record(self, aggregate: str, message_id: uuid.UUID, seq: int, *, retry_in: float | None,
               handled: bool) -> None:
        """After a commit: a failed message blocks its aggregate; one handled or dead-lettered frees it."""
        block = self._blocked.get(aggregate)
        if retry_in is not None:
            if block is None or block.message_id == message_id or block.lapsed(time.monotonic()):
                self._blocked[aggregate] = Block.retry_in(message_id, seq, retry_in)
        elif handled and block is not None and block.message_id == message_id:
            del self._blocked[aggregate]

    def forget_lapsed(self) -> None:
        """Bound the memory: blocks whose message went to another process are never freed here."""
        if len(self._blocked) > 10_000:
            now = time.monotonic()
            self._blocked = {a: b for a, b in self._blocked.items() if not b.lapsed(now)}
