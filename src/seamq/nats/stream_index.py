"""A stream read back by sequence, headers only, for the audit (the StreamIndex port).

The audit asks which messages a range of a stream holds and whose they are.
An ephemeral consumer that starts at the range's first sequence, sends headers
only and needs no acks reads a range at the pull's pace (no request per
message), and the server drops it by itself if we go away. (A consumer that
lost a few deliveries reads them back one by one: seamq.nats.stream_read.)
"""

from __future__ import annotations

import uuid
from datetime import datetime

from nats.aio.client import Client

from seamq.model import Header
from seamq.nats import jsapi, stream_read
from seamq.nats.pull import PullSource, ack_fields
from seamq.ports import Indexed

PAGE = 1000
QUIET = 5.0  # seconds a range read waits for the next message before it calls the range read


class JsStreamIndex:
    def __init__(self, nc: Client) -> None:
        self.nc = nc

    async def bounds(self, stream: str) -> tuple[int, int]:
        """(first, last) sequence; (0, 0) for a stream that never held anything."""
        info = await jsapi.call(self.nc, f"STREAM.INFO.{stream}") or {}
        state = info.get("state") or {}
        return int(state.get("first_seq", 0)), int(state.get("last_seq", 0))

    async def ack_floor(self, stream: str, durable: str) -> int | None:
        """The stream sequence below which the consumer has acked everything; None: no such consumer."""
        info = await jsapi.call(self.nc, f"CONSUMER.INFO.{stream}.{durable}")
        return None if info is None else int((info.get("ack_floor") or {}).get("stream_seq", 0))

    async def filters(self, stream: str, durable: str) -> list[str]:
        return await stream_read.filters(self.nc, stream, durable)

    async def seq_at(self, stream: str, when: datetime) -> int | None:
        """The first message's sequence at or after `when`; None when none is."""
        reply = await jsapi.call(self.nc, f"STREAM.MSG.GET.{stream}", {"start_time": when.isoformat()})
        return None if reply is None else int(reply["message"]["seq"])

    async def read(self, stream: str, first: int, last: int, subjects: list[str] | None = None) -> list[Indexed]:
        """The messages with `first` <= seq <= `last` (under `subjects`), in order."""
        if last < first:
            return []
        config = {"deliver_policy": "by_start_sequence", "opt_start_seq": max(1, first), "ack_policy": "none",
                  "headers_only": True, "inactive_threshold": 60_000_000_000, "mem_storage": True,
                  "num_replicas": 1, "max_batch": PAGE}
        if subjects and subjects != [">"]:
            config["filter_subjects"] = subjects
        created = await jsapi.call(self.nc, f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": config})
        name = created["name"]
        out: list[Indexed] = []
        pull = await PullSource(self.nc, stream, name, buffer=PAGE).start()
        try:
            pending = int(created.get("num_pending", 0))
            while pending:
                messages = await pull.fetch(PAGE, QUIET)
                if not messages:
                    raise TimeoutError(f"reading {stream} from {first}: nothing came for {QUIET:.0f} s")
                for msg in messages:
                    _, _, seq, _, pending = ack_fields(msg)
                    if seq > last:
                        return out
                    out.append(_indexed(seq, msg.subject, msg.headers or {}))
                    if seq == last:
                        return out
            return out
        finally:
            await pull.close(give_back=False)
            try:
                await jsapi.call(self.nc, f"CONSUMER.DELETE.{stream}.{name}", timeout=2)
            except Exception:  # it goes by itself after inactive_threshold
                pass


def _indexed(seq: int, subject: str, headers: dict[str, str]) -> Indexed:
    """Whose it is: a copy names the original's id (seamq.republish), an original its own."""
    raw = headers.get(Header.REPLAY_MESSAGE_ID) or headers.get(Header.MSG_ID) or ""
    try:
        message_id = uuid.UUID(raw)
    except ValueError:
        message_id = None
    return Indexed(seq, subject, message_id, copy=Header.REPLAY_MESSAGE_ID in headers,
                   for_consumer=headers.get(Header.REPLAY_CONSUMER))

