"""Publishing a message again, one path for DLQ replay, reconcile repair and lake replay.

A copy must really be handled again, so it gets a Nats-Msg-Id of its own
(`{why}:{message id}[:{round}]`: JetStream's duplicate window would drop the
original id), while Seamq-Message-Id keeps the original id, which stays the
inbox key, so a consumer that handled the original skips the copy. Only a
DLQ replay carries Seamq-Replay-Attempt, which lets it through a dead-lettered
inbox row, and Seamq-Replay-Consumer, the one consumer it is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from seamq.model import Header, OutMessage, PubResult, message_headers

if TYPE_CHECKING:  # a port as a type: the core calls the publisher it is handed, and knows no adapter
    from seamq.ports import JetStreamPublisher
    from seamq.topology import Topology

CHUNK = 1000  # copies per publish_many: bounded memory for any number of copies


@dataclass(frozen=True, slots=True)
class Copy:
    subject: str
    headers: Mapping[str, str]
    data: bytes
    message_id: str  # the original's id
    msg_id: str  # the copy's own Nats-Msg-Id
    replay_attempt: int | None = None  # DLQ replays only
    consumer: str | None = None  # DLQ replays only: the consumer that dead-lettered it

    def message(self) -> OutMessage:
        headers = dict(self.headers)
        headers.pop(Header.REPLAY_ATTEMPT, None)
        headers.pop(Header.REPLAY_CONSUMER, None)
        headers[Header.MSG_ID] = self.msg_id
        headers[Header.REPLAY_MESSAGE_ID] = self.message_id
        if self.replay_attempt is not None:
            headers[Header.REPLAY_ATTEMPT] = str(self.replay_attempt)
        if self.consumer is not None:
            headers[Header.REPLAY_CONSUMER] = self.consumer
        kind, name = headers.get(Header.AGGREGATE_TYPE), headers.get(Header.AGGREGATE_ID)
        key = (kind, name) if kind is not None and name is not None else None  # its copies stored in order
        return OutMessage(self.subject, self.data, headers, key=key)


def repair_copy(topology: Topology, row: Any) -> Copy:
    """An outbox row missing from its stream, as the relay would have published it (`repair:{id}`):
    the audit's repair and the reconcile's. `row` has an OutboxRow's fields."""
    return Copy(topology.event_subject(row.context, row.event_type, row.event_version, row.bucket),
                message_headers(row, row.traceparent), row.payload.encode(), str(row.id), msg_id=f"repair:{row.id}")


async def republish(publisher: JetStreamPublisher, copies: Iterable[Copy], *,
                    progress: Callable[[int], None] = lambda done: None) -> list[PubResult]:
    """Publish every copy, CHUNK at a time; the results in order."""
    results: list[PubResult] = []
    chunk: list[OutMessage] = []
    for copy in copies:
        chunk.append(copy.message())
        if len(chunk) == CHUNK:
            results += await publisher.publish_many(chunk)
            progress(len(results))
            chunk = []
    if chunk:
        results += await publisher.publish_many(chunk)
        progress(len(results))
    return results
