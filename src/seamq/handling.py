"""One delivery as a consumer's lane handles it (seamq.consumer): the message, what parsing made of
it, and the verdict the lane gives it (seamq.verdict); and the inbox rows a lane's deliveries
stand for."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from seamq import dead_letter
from seamq.envelope import Envelope, HandlerResult, Rejected
from seamq.model import Header, OutMessage
from seamq.ports import Delivery, Handler, InboxItem
from seamq.topology import ConsumerSpec
from seamq.verdict import Ack, DeadLetter, Duplicate, Verdict


@dataclass(frozen=True, eq=False, slots=True)
class Handling:
    """One fetched message as parsing left it: what it is, never what became of it (Decided).

    Compared by identity: a lane keeps what it learned of each message across its runs (Tried)."""

    msg: Delivery
    envelope: Envelope[Any] | None  # parsed fine (it may still have no handler)
    rejected: Rejected | None  # why it can never be handled
    handler: Handler | None = None
    for_another: bool = False  # a DLQ replay or an edited copy for another consumer of the subject: skipped
    fetched: float = field(default_factory=time.monotonic)  # when it was fetched (seamq.holds: its grace)

    @property
    def seq(self) -> int:
        return self.msg.seq

    @property
    def replay(self) -> bool:
        """A DLQ replay for this consumer: it runs a dead-lettered message again."""
        return bool(self.envelope and self.envelope.replay_attempt) and not self.for_another

    @property
    def delivered(self) -> int:
        return self.msg.delivered

    @property
    def message_id(self) -> uuid.UUID | None:
        if self.envelope:
            return self.envelope.message_id
        return self.rejected.message_id if self.rejected else None

    @property
    def aggregate(self) -> str:
        if self.envelope:
            return self.envelope.aggregate
        return str(self.message_id)

    def dead_letter(self, spec: ConsumerSpec, verdict: DeadLetter, max_payload: int, attempt: int) -> OutMessage:
        """Its dead letter (EVT-047-002), for the verdict it is given on its `attempt`."""
        msg = self.msg
        return dead_letter.message(
            spec, reason=verdict.reason, detail=verdict.detail, message_id=self.message_id,
            original_subject=msg.subject, headers=msg.headers, data=msg.data, stream=msg.stream, seq=msg.seq,
            attempts=attempt, max_payload=max_payload,
        )


@dataclass(frozen=True, slots=True)
class Decided:
    """What one run of a lane made of a message: its verdict (seamq.verdict), given once, and the
    attempt it counts. A run that is redone makes new ones: nothing of an earlier run is left in it."""

    item: Handling
    verdict: Verdict
    attempts: int = 0  # the handler's attempts before this delivery (the inbox counts them: seamq.verdict)
    attempted: bool = False  # its handler ran in this run
    copy: bool = False  # a further copy of a message id decided before in its lane: settled as that one
    dlq_seq: int | None = None  # where its dead letter was stored

    @property
    def ack(self) -> bool:
        return isinstance(self.verdict, (Ack, Duplicate, DeadLetter))  # a dead letter once it is published

    @property
    def attempt(self) -> int:
        """This attempt's number, or the last one's when the handler did not run now."""
        return attempt_number(self.attempts, self.attempted)


def attempt_number(attempts: int, attempted: bool) -> int:
    return max(1, attempts + int(attempted))


@dataclass
class Tried:
    """What a lane keeps of its messages across its runs (a redo with savepoints; each message on
    its own after the lane failed): an HTTP handler's answer, so that it is never called twice, and
    the attempts the inbox had counted before, for the verdict of a run that failed."""

    answers: dict[Handling, HandlerResult] = field(default_factory=dict)
    attempts: dict[Handling, int] = field(default_factory=dict)


def header_uuid(msg: Delivery) -> uuid.UUID | None:
    try:
        return uuid.UUID(msg.headers.get(Header.MSG_ID, ""))
    except (ValueError, TypeError, AttributeError):
        return None


def replays_first(items: list[Handling]) -> list[Handling]:
    """The order a lane decides its items in: stream order, except that a DLQ replay takes the place
    of the first copy of its message id. The copies of a message id are settled as the first one
    decided; a stale redelivery of a dead letter's original (its ack lost) decided before its
    replay was found dead-lettered, a duplicate, and the replay was acked with it, never run."""
    if not any(item.replay for item in items):  # nearly every lane
        return items
    order = list(items)
    first: dict[uuid.UUID, int] = {}
    for i, item in enumerate(items):
        if item.message_id is None or item.for_another:
            continue
        j = first.setdefault(item.message_id, i)
        if item.replay and not order[j].replay:
            order[i], order[j] = order[j], order[i]
    return order


def inbox_items(items: list[Handling]) -> list[InboxItem]:
    seen, out = set(), []
    for item in items:
        message_id = item.message_id
        if message_id is None or message_id in seen or item.for_another:
            continue
        seen.add(message_id)
        env = item.envelope
        out.append(InboxItem(
            message_id=message_id, subject=item.msg.subject,
            event_type=env.event_type if env else None, event_version=env.event_version if env else None,
            occurred_at=env.occurred_at if env else None, replay=item.replay,
            deliver_at=env.deliver_at if env else None,
        ))
    return out
