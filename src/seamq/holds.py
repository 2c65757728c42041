"""Per-aggregate order under failures: an aggregate's messages wait behind its failed one.

A failed message is NAKed with a backoff. No later message of its aggregate
may overtake it, nor may the later ones overtake each other while they wait,
so the consumer keeps, per aggregate, every message it has sent back to
JetStream and not yet seen handled (`waiting`: stream sequence -> when it is
due back). A message is handled only when nothing earlier of its aggregate is
waiting; otherwise it is held: NAKed to come back just after the latest of
those is due, and added to the waiting ones. Held messages therefore come back
in stream order, each after the one before it, and one that comes back early
is simply held again. A fresh message of a held aggregate waits behind the
held ones, not only behind the failure.

The state outlives a lane transaction, since redelivered messages arrive in
later ones, and lives in one consumer process. A waiting message that does not
come back within HOLD_GRACE of its due time (it went to another process)
stops holding the others back. A hold is not an attempt: it costs the held
message none of its max_deliver (seamq.verdict), so a message may be held as
often as its aggregate needs.
"""

from __future__ import annotations

import time

HOLD_MARGIN = 0.05  # a held message comes back this long after the one before it
HOLD_GRACE = 5.0  # a waiting message that has not come back this long after it was due no longer holds others


class Holds:
    """aggregate -> {stream seq: due (monotonic)} of its messages sent back and not yet handled."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[int, float]] = {}

    def delay(self, aggregate: str, seq: int, pending: "Pending") -> float | None:
        """How long to hold this message (a NAK delay), or None to handle it now.

        `pending` holds what the lane transaction in progress decided so far.
        """
        waiting = self._waiting.get(aggregate)
        mine = pending.get(aggregate)
        if not waiting and not mine:
            return None
        now = time.monotonic()
        merged = {**waiting, **mine} if waiting and mine else dict(waiting or mine)
        earlier = [due for s, due in merged.items() if s < seq and due is not None and now <= due + HOLD_GRACE]
        if not earlier:
            return None
        return max(max(earlier) - now, 0.0) + HOLD_MARGIN

    def record(self, pending: "Pending") -> None:
        """After a commit: what the lane sent back waits; what it handled or dead-lettered is done."""
        for aggregate, seqs in pending.items():
            waiting = self._waiting.setdefault(aggregate, {})
            for seq, due in seqs.items():
                if due is None:
                    waiting.pop(seq, None)
                else:
                    waiting[seq] = due
            now = time.monotonic()
            for seq in [s for s, due in waiting.items() if due + HOLD_GRACE < now]:
                del waiting[seq]
            if not waiting:
                del self._waiting[aggregate]
        if len(self._waiting) > 10_000:  # bound the memory: drop what can no longer hold anything back
            now = time.monotonic()
            self._waiting = {a: w for a, w in self._waiting.items() if max(w.values()) + HOLD_GRACE >= now}


class Pending(dict):
    """One lane transaction's decisions: aggregate -> {seq: due back, or None once done}."""

    def send_back(self, aggregate: str, seq: int, delay: float) -> float:
        """Record a NAK of `delay`, stretched so this message comes back after its aggregate's
        earlier ones sent back in this lane; returns the delay to NAK with."""
        now = time.monotonic()
        mine = self.setdefault(aggregate, {})
        earlier = [due for s, due in mine.items() if s < seq and due is not None]
        if earlier:
            delay = max(delay, max(earlier) - now + HOLD_MARGIN)
        mine[seq] = now + delay
        return delay

    def done(self, aggregate: str, seq: int) -> None:
        self.setdefault(aggregate, {})[seq] = None
