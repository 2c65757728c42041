"""A stream's messages read back by sequence, one direct get each.

Two readers need a stream's messages again: the audit walks whole ranges
(seamq.nats.stream_index, through an ephemeral consumer, at the pull's pace),
and a consumer that lost deliveries in flight reads back the few it missed
(seamq.nats.gaps). The second one runs right after a fault, often while the
cluster has no meta leader, and creating a consumer needs one; a direct get
needs only the stream's leader. What a consumer reads, its filters, is stated
here for both.
"""

from __future__ import annotations

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from seamq.nats import jsapi
from seamq.ports import StoredMessage


async def filters(nc: Client, stream: str, durable: str) -> list[str]:
    """The subjects a durable consumer reads (">" for all of the stream's)."""
    return (await sent_so_far(nc, stream, durable))[0]


async def sent_so_far(nc: Client, stream: str, durable: str) -> tuple[list[str], int]:
    """A durable consumer's filters, and the highest stream sequence it has sent (to anyone) yet."""
    info = await jsapi.call(nc, f"CONSUMER.INFO.{stream}.{durable}") or {}
    config = info.get("config") or {}
    subjects = list(config.get("filter_subjects") or []) or [config.get("filter_subject") or ">"]
    return subjects, int((info.get("delivered") or {}).get("stream_seq") or 0)


async def between(nc: Client, stream: str, low: int, high: int, subjects: list[str], most: int) -> list[StoredMessage]:
    """The messages under `subjects` with `low` < seq < `high`, in order, `most` of them at most."""
    js = nc.jetstream()
    found: dict[int, StoredMessage] = {}
    for subject in subjects:
        seq = low + 1
        while seq < high and len(found) < most:
            try:
                raw = await js.get_msg(stream, seq, subject=subject, next=True)
            except NotFoundError:
                break
            if not raw.seq or raw.seq >= high:
                break
            found[raw.seq] = StoredMessage(raw.subject or "", dict(raw.headers or {}), raw.data or b"", raw.seq)
            seq = raw.seq + 1
    return [found[s] for s in sorted(found)[:most]]
