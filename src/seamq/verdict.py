"""The consumer's rules for one delivery, in one place: what is known about it in, one value out.

POL-047-005..007 and CMD-052 decide, for each message a lane takes, between
four things: ACK it (handled, or a copy of one handled), skip it as a duplicate
(ACK without calling anything), NAK it to come back after a delay, or
dead-letter it with a reason (then ACK). Everything that bears on it (the
inbox's admission, why it cannot be parsed, whether its aggregate holds it
back, the handler's result, its attempt number against max_deliver) is an
argument, and the answer is a value the lane carries out: no I/O here, and a
unit test per rule beside it (tests/unit/messaging/test_verdict.py).

max_deliver bounds the handler's attempts, not JetStream's deliveries: a
message held behind its aggregate, redelivered after a consumer died, or sent
again after a broker restart was not attempted, and the inbox counts only what
was (docs/operations.md, "What max_deliver counts"). JetStream's own delivery
limit is off for seamq's consumers, so nothing is ever dropped in silence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from seamq.backoff import Backoff
from seamq.envelope import HandlerResult, Outcome, Reason, Rejected


@dataclass(frozen=True, slots=True)
class Ack:
    """Handled: record it done, ACK."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The inbox has it processed (or dead-lettered) already: ACK, call nothing (POL-047-005)."""


@dataclass(frozen=True, slots=True)
class Nak:
    """Come back after `delay` seconds; `error` is recorded on the inbox row, unless it is only held."""

    delay: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Publish EVT-047-002 with this reason, record it, ACK (POL-047-006/007)."""

    reason: Reason
    detail: str


Verdict = Ack | Duplicate | Nak | DeadLetter


def decide(*, duplicate: bool, rejected: Rejected | None, after: float | None, result: HandlerResult | None,
           attempt: int, max_deliver: int, backoff: Backoff, rng: random.Random | None = None) -> Verdict:
    """The rules, in the order they apply. `after` is how long the message must stay away to come
    back behind its aggregate's earlier ones that are away (seamq.holds; None: none is); `result`
    is the handler's, None when it was not called because it is held behind them; `attempt` is the
    handler's attempt this result came from (1 on the first)."""
    if duplicate:
        return Duplicate()
    if rejected is not None:  # it can never be handled: retrying would only delay the dead letter
        return DeadLetter(rejected.reason, rejected.detail)
    if result is None:  # held: an earlier message of its aggregate was sent back; it waits behind it
        if after is None:
            raise ValueError("a message that may run needs its handler's result")
        return Nak(after)
    if result.done:
        return Ack()
    if result.outcome == Outcome.BUSY:  # not attempted: the service runs it in another call right now
        return _back(backoff.delay(attempt, rng), after, None)
    if result.outcome == Outcome.POISON:
        return DeadLetter(result.reason or Reason.HANDLER_REJECTED, result.detail or "handler rejected it")
    if attempt >= max_deliver:
        return DeadLetter(Reason.MAX_DELIVER, f"{attempt} attempts; last: {result.detail}")
    return _back(backoff.delay(attempt, rng), after, result.detail or "retry")


def copy_of(first: Verdict, *, after: float | None) -> Verdict:
    """A second copy of one message in the same lane is settled as the first was: skipped when the
    first was handled, sent back behind it when the first was; never run twice."""
    if isinstance(first, (Ack, Duplicate)):
        return Duplicate()
    if isinstance(first, Nak):
        return _back(first.delay, after, first.error)
    return first


def lane_failed(*, error: str, alone: bool, attempt: int, max_deliver: int, database_away: bool,
                backoff: Backoff, after: float | None = None, rng: random.Random | None = None) -> Verdict:
    """The lane's transaction failed, so nothing of it committed: every message comes back, except one
    whose transaction failed alone on its last attempt for a reason other than the database being
    away, which is a bug of ours shown by that message (`consumer_error`). A failure alone counts as
    an attempt (the consumer records it apart); a lane's or the database's does not."""
    if alone and attempt >= max_deliver and not database_away:
        return DeadLetter(Reason.CONSUMER_ERROR, f"its transaction failed on all {attempt} attempts: {error}")
    return _back(backoff.delay(attempt, rng), after, error)


def dead_letter_failed(verdict: DeadLetter, error: str, *, attempt: int, backoff: Backoff,
                       after: float | None = None, rng: random.Random | None = None) -> Nak:
    """The DLQ publish failed: the message must not be ACKed; it comes back and is decided again."""
    return _back(backoff.delay(attempt, rng), after, f"DLQ publish failed ({error}); was: {verdict.reason.value}")


def _back(delay: float, after: float | None, error: str | None) -> Nak:
    """A message sent back never comes back before its aggregate's earlier ones that are away."""
    return Nak(delay if after is None else max(delay, after), error)
