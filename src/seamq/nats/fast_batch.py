"""JetStream fast batch publishing (nats-server >= 2.14), with the pipelined path as the fallback.

A fast batch stores each message as it arrives and acknowledges every `flow`
messages instead of each one, which takes most of the client's CPU per
message away (nats-py has no API for it). The whole protocol is in the reply
subject: `{inbox}.{flow}.{gap}.{batch seq}.{operation}.$FI`, where the
inbox's last token is the batch id (unique per stream, so it carries this
publisher's nuid). The server answers on that subject:

- `{"type":"ack","seq":N,"msgs":F}`: in `gap: fail` mode, batch messages 1..N
  are stored (a Nats-Msg-Id duplicate counts as stored: JetStream skips it
  and the batch goes on); acks come every F messages from now on.
- `{"type":"err","seq":N,...}`, a 503 on message N's reply, or a `gap`: the
  batch ends at N - 1.
- A final `{"stream":...,"seq":S,"count":C}`: messages 1..C are stored, none
  after. `{"error":...}` instead: none past what was acked.

So the rule for the relay is one number: results 1..C are stored; the first
message after them gets the reason it failed; the rest are `held` and are
claimed again (their Msg-Ids make that safe). A batch that ends without a
final answer (a timeout, the connection) has C = 0, whatever flow acks came:
a stream leader cut off from its peers acks what it cannot replicate. A batch said stored
with no stream sequence (every message a duplicate, or flow acks before a refusal) is asked again
one message at a time: a leader split from its peers counts a duplicate it has only proposed as
stored (nats-server 2.15.1). What a fast batch does not say
is each message's stream sequence, only S, the last one's: every stored
result carries S, "stored at or before S" (exact for the last, and for a
batch of one). Reconcile reads `stream_seq` that way.

Each call publishes one batch per stream; messages of a stream without
`allow_batched` (or of no known stream) go through the PipelinedPublisher.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg

from seamq.nats.publisher import UNREACHABLE, PipelinedPublisher
from seamq.nats.wire import Wire, header_block
from seamq.observability import log
from seamq.ports import OutMessage, PubResult
from seamq.model import describe

START, ADD, COMMIT, END, PING = 0, 1, 2, 3, 4  # operations in the reply subject
MIN_SERVER = (2, 14)
DISABLED = 10205  # "batch publish is disabled" on the stream


def server_batches(nc: Client) -> bool:
    version = nc.connected_server_version
    return (version.major, version.minor) >= MIN_SERVER


async def batched_streams(nc: Client, streams: list[str]) -> set[str]:
    """The streams a relay can publish to in fast batches: the server has them, the stream allows them
    (`seamq provision` turns that on), and it has one replica. A replicated stream's leader counts a
    duplicate it has only proposed as stored in a fast batch (nats-server 2.15.1), so a batch sent
    again after a timeout can be said stored and be lost with that leader (the partitions lab lost
    15 events so, with a stream sequence in the ack); one publish each gets exact answers. Chosen at
    connect time; a stream that turns batches off later answers "disabled", and the publisher goes
    back to pipelining for it."""
    if not server_batches(nc):
        return set()
    js = nc.jetstream()
    out = set()
    for name in streams:
        try:
            config = (await js.stream_info(name)).config
            if config.allow_batched and (config.num_replicas or 1) == 1:
                out.add(name)
        except Exception as exc:  # no such stream yet, or no answer: pipelined, which reports per message
            log.info("fast_batch_unknown", stream=name, error=describe(exc))
    return out


_NO_ACK = "timeout waiting for JetStream ack"
_HELD = PubResult(ok=False, held=True, error="an earlier message of its batch was not stored")


@dataclass(eq=False)
class _OpenBatch:
    size: int
    flow: int
    acked: int = 0  # batch messages 1..acked are stored
    stored: int | None = None  # from the final ack: 1..stored are, nothing after
    last_seq: int | None = None  # ...and the stream sequence of the last stored
    failed_at: int | None = None  # the first message known not stored, and why
    reason: str | None = None
    transport: bool = False  # ...because of the connection, not the message
    disabled: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def fail(self, seq: int, reason: str, transport: bool = False) -> None:
        if self.failed_at is None or seq < self.failed_at:
            self.failed_at, self.reason, self.transport = seq, reason, transport

    @property
    def ended(self) -> bool:
        return self.stored is not None or self.failed_at is not None

    def results(self) -> list[PubResult]:
        # A flow ack is trusted when the batch ended on a message the stream refused, which a leader
        # said; not when it ended with no answer (a leader split from its peers acked messages it
        # could not replicate, and they were gone: 294 of 20,000 in the partitions lab). Those are
        # sent again; their Msg-Ids make that safe.
        known = self.acked if not self.transport else 0
        stored = min(self.size, self.stored if self.stored is not None else known)
        out = [PubResult(ok=True, seq=self.last_seq)] * stored
        if stored < self.size:
            if self.failed_at == stored + 1 and not self.transport:
                out.append(PubResult(ok=False, error=self.reason))
            else:
                out.append(PubResult(ok=False, transport=True,
                                     error=self.reason or _NO_ACK))
            out += [_HELD] * (self.size - stored - 1)
        return out


class FastBatchPublisher:
    """PORT-047-003 over fast batches: `publish_many` results in input order, as the pipelined one's."""

    def __init__(self, nc: Client, batched: set[str], fallback: PipelinedPublisher, *, timeout: float = 5.0,
                 flow: int = 100, window: int = 5) -> None:
        """`batched`: streams provisioned with allow_batched on a server that has it."""
        self._nc = nc
        self._wire = Wire(nc)
        self._fallback = fallback
        self.batched = set(batched)
        self._timeout = timeout
        self._flow = flow
        self._window = window  # acks outstanding before sending waits
        self._prefix = nc.new_inbox()
        self._id = self._prefix.rsplit(".", 1)[-1]  # a nuid: batch ids are unique per stream
        self._count = 0
        self._open: dict[str, _OpenBatch] = {}
        self._sub = None

    async def start(self) -> "FastBatchPublisher":
        self._sub = await self._nc.subscribe(self._prefix + ".>", cb=self._on_frame)
        return self

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]:
        groups: dict[str | None, list[int]] = {}
        for i, message in enumerate(messages):
            groups.setdefault(message.stream if message.stream in self.batched else None, []).append(i)
        results: list[PubResult | None] = [None] * len(messages)

        async def run(stream: str | None, indexes: list[int]) -> None:
            chunk = [messages[i] for i in indexes]
            done = await (self._batch(stream, chunk) if stream else self._fallback.publish_many(chunk))
            for i, result in zip(indexes, done):
                results[i] = result

        await asyncio.gather(*(run(stream, indexes) for stream, indexes in groups.items()))
        return results  # type: ignore[return-value]

    async def _batch(self, stream: str, messages: list[OutMessage]) -> list[PubResult]:
        self._count += 1
        batch_id = f"{self._id}{self._count}"
        batch = self._open[batch_id] = _OpenBatch(len(messages), self._flow)
        inbox = f"{self._prefix}.{batch_id}.{self._flow}.fail."
        subject = messages[0].subject
        try:
            sent = await self._send(batch, inbox, messages)
            while sent and batch.stored is None and not batch.transport:  # wait for the final ack
                if not await self._progress(batch, f"{inbox}{sent}.{PING}.$FI", subject):
                    batch.fail(batch.acked + 1, _NO_ACK, transport=True)
        finally:
            del self._open[batch_id]
        if batch.disabled:
            self.batched.discard(stream)
            log.warning("fast_batch_disabled", stream=stream, fallback="pipelined")
            return await self._fallback.publish_many(messages)
        results = batch.results()
        if batch.last_seq is None and results and results[0].ok:
            # Stored, the server said, with no stream sequence: no message of this batch was written by
            # it (all duplicates), or only flow acks said so. A stream leader split from its peers says
            # that of duplicates it has only proposed: the partitions lab lost 15 events of a batch
            # sent again after a timeout. One publish each tells: a duplicate's ack names where it is,
            # one not yet replicated gets an error.
            unsure = sum(1 for r in results if r.ok)
            results[:unsure] = await self._fallback.publish_many(messages[:unsure])
        return results

    async def _send(self, batch: _OpenBatch, inbox: str, messages: list[OutMessage]) -> int:
        """Send until the last (which commits) or until the batch ends; returns how many went out."""
        last = len(messages)
        for seq, message in enumerate(messages, 1):
            while seq - batch.acked > batch.flow * self._window and not batch.ended:  # flow control
                if not await self._progress(batch, f"{inbox}{seq - 1}.{PING}.$FI", message.subject):
                    batch.fail(batch.acked + 1, _NO_ACK, transport=True)
            if batch.ended:
                return seq - 1
            op = COMMIT if seq == last else START if seq == 1 else ADD
            try:
                await self._wire.publish(message.subject, message.payload, reply=f"{inbox}{seq}.{op}.$FI",
                                         headers=header_block(message.headers))
            except Exception as exc:
                transport = isinstance(exc, UNREACHABLE)
                batch.fail(seq, describe(exc), transport=transport)
                if seq == 1 or transport:
                    return seq - 1
                # the message cannot be sent (too big, a bad header): end the batch before it
                try:
                    await self._wire.publish(message.subject, b"", reply=f"{inbox}{seq}.{END}.$FI")
                except Exception as end_failed:
                    batch.fail(seq, f"{type(end_failed).__name__}: {end_failed}", transport=True)
                return seq - 1
        return last

    async def _progress(self, batch: _OpenBatch, ping: str, subject: str) -> bool:
        """Wait for a frame that moves the batch on; after a third of the timeout ask again (a ping:
        lost acks are sent again). False when the whole timeout passed without one."""
        for _ in range(3):
            batch.progress.clear()
            try:
                await asyncio.wait_for(batch.progress.wait(), self._timeout / 3)
                return True
            except asyncio.TimeoutError:
                try:
                    await self._wire.publish(subject, b"", reply=ping)
                except Exception:
                    return False
        return False

    async def _on_frame(self, msg: Msg) -> None:
        batch_id, _flow, _gap, seq_token, *_ = msg.subject[len(self._prefix) + 1:].split(".")
        batch = self._open.get(batch_id)
        if batch is None:
            return  # a batch already given up on
        seq = int(seq_token)
        data = msg.data
        was = (batch.acked, batch.stored, batch.failed_at)
        if not data:
            status = (msg.headers or {}).get("Status", "")
            batch.fail(seq, "no stream accepts this subject (503 no responders)" if status == "503"
                       else f"empty reply (status {status or 'none'})")
        else:
            try:
                frame = json.loads(data)
            except ValueError:
                frame = {"type": "err", "seq": seq, "error": {"description": f"unreadable: {data[:100]!r}"}}
            kind = frame.get("type")
            if kind == "ack":
                batch.acked = max(batch.acked, int(frame.get("seq", 0)))
                batch.flow = max(1, int(frame.get("msgs") or batch.flow))
            elif kind == "gap":
                batch.fail(int(frame.get("last_seq", seq)), "lost on the way to the server (a gap in the batch)",
                           transport=True)
            elif kind == "err":
                err = frame.get("error") or {}
                batch.fail(int(frame.get("seq", seq)), f"JetStream error {err.get('err_code') or err.get('code')}: "
                                                       f"{err.get('description')}")
            elif "error" in frame:
                err = frame["error"]
                if err.get("err_code") == DISABLED:
                    batch.disabled = True
                away = int(err.get("code") or 0) >= 500  # no leader to stand by the flow acks (results())
                batch.fail(seq, f"JetStream error {err.get('err_code') or err.get('code')}: {err.get('description')}",
                           transport=away)
                if batch.stored is None:
                    batch.stored = 0 if away else batch.acked
            else:
                batch.stored = int(frame.get("count", 0))
                batch.last_seq = frame.get("seq") or None
        # Progress is a frame that moves the batch on. A server that answers our pings but stores
        # nothing (a stream leader split from its peers) kept a batch waiting until the split healed.
        if (batch.acked, batch.stored, batch.failed_at) != was:
            batch.progress.set()
