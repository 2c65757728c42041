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
come back within the grace after its due time stops holding the others back:
those fetched more than the grace after it was due. The grace is the consumer's
ack_wait: a NAK can be lost (with a connection to a server cut off before the
client noticed, or with a consumer leader that changed before it arrived), and
its message then comes back only when ack_wait runs out, which JetStream
promises whatever was lost. One that went to another process holds its
aggregate here that long at most. Fetched, not handled: on a busy machine a
lane may reach a message long after it was fetched, while the failed one,
redelivered on time, waits behind it in the same lane; judged by the clock when
the lane reaches it, the later message would overtake the failed one (seen: 4
of 200 aggregates out of order in the partitions soak on a machine slowed down
several times).

A message the server sent and the consumer never received (lost in flight with
a connection or a route cut) comes back after ack_wait too; the source names
those (seamq.nats.gaps) and they wait here as if sent back (`expect`).

Time in which nothing could come back does not count against the grace: after
this process lost its connection, or while no consumer leader answered its
pulls (an election, a leader cut off or split from its peers), the waiting ones
wait ack_wait again from when deliveries resume (`resumed`): a leader can be
away longer than the grace (18 s once, a split on a busy machine).

A hold is not an attempt: it costs the held message none of its max_deliver
(seamq.verdict), so a message may be held as often as its aggregate needs.
"""

from __future__ import annotations

import time

HOLD_MARGIN = 0.05  # a held message comes back this long after the one before it
HOLD_GRACE = 5.0  # the least grace: a consumer whose ack_wait is shorter still gets this long
OVERDUE_AWAY = 1.0  # a message held behind one past its due comes back after this (not at once, again and again)
FORGET = 600.0  # a waiting message is forgotten this long after it was due (for memory: it holds nothing by then)


class Holds:
    """aggregate -> {stream seq: due (monotonic)} of its messages sent back and not yet handled."""

    def __init__(self, ack_wait: float = 0.0) -> None:
        self._waiting: dict[str, dict[int, float]] = {}
        self.ack_wait = ack_wait
        self.grace = max(HOLD_GRACE, ack_wait + 1.0)  # a waiting message no longer holds back what is
        # fetched this long after it was due (module docstring)

    def after(self, aggregate: str, seq: int, pending: "Pending", *, fetched: float | None = None) -> float | None:
        """How long this message must stay away to come back after its aggregate's earlier ones that
        are away (None: none is). `pending` holds what the lane transaction in progress decided so
        far; with `fetched` (when this message was fetched, monotonic) what earlier transactions
        sent back counts too (ordered mode: a message is held while this is not None)."""
        mine = pending.get(aggregate) or {}
        earlier = [due for s, due in mine.items() if s < seq and due is not None]
        if fetched is not None and (held := self._waiting.get(aggregate)):
            earlier += [due for s, due in held.items() if s < seq and s not in mine and fetched <= due + self.grace]
        if not earlier:
            return None
        away = max(earlier) - time.monotonic()
        return (away if away > 0 else OVERDUE_AWAY) + HOLD_MARGIN

    def expect(self, aggregate: str, seq: int) -> None:
        """A message sent to us and lost on the way (seamq.nats.gaps): JetStream sends it again within
        ack_wait, and its aggregate's later messages wait for it as for one sent back."""
        self._waiting.setdefault(aggregate, {})[seq] = time.monotonic() + self.ack_wait

    def resumed(self, at: float) -> int:
        """Deliveries came again at `at` after the connection was lost, or after no consumer leader
        answered: a message sent back before may have been sent again while we were away, and lost
        too, or its NAK lost with the leader; it comes back within ack_wait from now, so what waits
        for it waits that long again. The number of aggregates that wait."""
        for waiting in self._waiting.values():
            for seq, due in waiting.items():
                waiting[seq] = max(due, at)
        return len(self._waiting)

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
            for seq in [s for s, due in waiting.items() if due + FORGET < now]:
                del waiting[seq]
            if not waiting:
                del self._waiting[aggregate]
        if len(self._waiting) > 10_000:  # bound the memory: drop what can no longer hold anything back
            now = time.monotonic()
            self._waiting = {a: w for a, w in self._waiting.items() if max(w.values()) + FORGET >= now}


class Pending(dict[str, dict[int, float | None]]):
    """One lane transaction's decisions: aggregate -> {seq: due back, or None once done}."""

    def note(self, aggregate: str, seq: int, away: float | None) -> None:
        """A message sent back for `away` seconds, or done (None)."""
        self.setdefault(aggregate, {})[seq] = None if away is None else time.monotonic() + away
