"""The online audit (issue 47): proves, while the workers run, that nothing was lost between them.

The relay marks an outbox row published on JetStream's ack, and a consumer
acks a message once its inbox row is committed. Nothing else looks again: a
stream that loses acknowledged writes (a power loss under JetStream's default
fsync, a store rolled back), a database failover that loses its last commits,
an inbox row gone, would all go unnoticed. Three walks, each from a cursor
kept in the database, a page per round:

- `published:<context>`: every row marked published is in its stream. A row
  of a fast batch holds the batch's last sequence, so its message is looked
  for among the `span` messages up to it (a row sent again after a failed
  batch can be stored further back: a row not there is looked for `WIDER`
  spans around before it is reported). What is missing is a finding
  `not_in_stream`, and is published again from its row (`repair:{id}`:
  consumers skip what they have handled, by their inbox), its row then
  saying where the copy went.
- `stream:<context>`: every event in the stream has its outbox row; one
  without is `outbox_row_gone` (a failover lost the commit that wrote it,
  after the relay published it). Copies (replays, repairs) are not judged.
- `inbox:<durable>`: every message of a consumer below its ack floor has an
  inbox row that is finished (processed, dead-lettered); one that has not is
  `not_in_inbox`. Not repaired: the consumer's record is what is gone, and
  sending the message again could run its handler twice.

A finding is recorded once (audit_findings), logged, and counted
(`seamq_audit_found_total`). Rows older than the stream's first message
(aged out by its limits) are not judged. Jobs enqueued through the outbox go to
a work queue that empties as jobs are taken, which is no context of the
topology: not walked.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum

from prometheus_client import Counter, Gauge

from seamq.health import Health
from seamq.model import describe
from seamq.observability import log
from seamq.ports import AuditStore, Finding, Indexed, JetStreamPublisher, StreamIndex, Walked
from seamq.republish import republish, repair_copy
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology

AUDIT_CHECKED = Counter("seamq_audit_checked_total", "Rows and messages the audit has checked", ["walk"])
AUDIT_FOUND = Counter("seamq_audit_found_total", "Things the audit found missing", ["kind", "scope"])
AUDIT_REPAIRED = Counter("seamq_audit_repaired_total", "Rows missing from their stream published again", ["scope"])
AUDIT_BEHIND = Gauge("seamq_audit_behind", "How far a walk is behind what it walks (seconds for published rows, "
                     "messages for streams)", ["walk"])


WIDER = 20  # relay batches around a page a row missing from it is looked for in, before it is reported


class Kind(str, Enum):
    NOT_IN_STREAM = "not_in_stream"
    OUTBOX_ROW_GONE = "outbox_row_gone"
    NOT_IN_INBOX = "not_in_inbox"


@dataclass
class Round:
    """What one round did, per walk."""

    checked: dict[str, int] = field(default_factory=dict)
    found: list[Finding] = field(default_factory=list)  # found now for the first time
    missing: int = 0  # found missing now, whether found before or not
    repaired: int = 0
    behind: dict[str, float] = field(default_factory=dict)
    rounds: int = 1

    @property
    def done(self) -> bool:
        """Every walk has caught up: nothing was left for another page."""
        return not any(self.behind.values())


class Auditor:
    def __init__(self, store: AuditStore, index: StreamIndex, publisher: JetStreamPublisher, topology: Topology, *,
                 lookback: float, settle: float, span: int, page: int = 5000, interval: float = 10.0,
                 repair: bool = True, health: Health | None = None) -> None:
        """`lookback`: how far back a walk without a cursor starts (seconds); `settle`: how old a published
        mark must be; `span`: the largest batch a relay publishes (its `batch_size`)."""
        self.store, self.index, self.publisher, self.topology = store, index, publisher, topology
        self.lookback, self.settle, self.span, self.page = lookback, settle, span, page
        self.interval, self.repair = interval, repair
        self.health = health or Health()

    async def run(self, stop: asyncio.Event) -> None:
        beat = self.health.beat("audit")
        self.health.started = True
        while not stop.is_set():
            try:
                with beat:
                    done = (await self.run_once()).done
            except Exception as exc:  # database or broker away: try again next round
                log.warning("audit_round_failed", error=describe(exc))
                done = True
            if done:
                await sleep_unless_stopped(stop, self.interval)

    async def catch_up(self) -> Round:
        """Rounds until every walk has caught up, summed: `seamq audit --once`."""
        total = Round()
        while True:
            done = await self.run_once()
            total.rounds += 1
            for walk, count in done.checked.items():
                total.checked[walk] = total.checked.get(walk, 0) + count
            total.found += done.found
            total.missing += done.missing
            total.repaired += done.repaired
            if done.done:
                return total

    async def run_once(self) -> Round:
        """A page of every walk."""
        out = Round()
        for name, context in sorted(self.topology.contexts.items()):
            await self._published(name, context.stream.name, out)
            if self.repair:
                await self._repair(name, out)
            await self._stream(name, context.stream.name, out)
        for spec in sorted(self.topology.consumers.values(), key=lambda s: s.name):
            for durable in spec.durables():
                await self._inbox(spec.name, spec.stream, durable, out)
        return out

    async def _published(self, context: str, stream: str, out: Round) -> None:
        walk = f"published:{context}"
        after = await self.store.cursor(walk) or Walked(at=await self.store.now() - timedelta(seconds=self.lookback))
        rows = await self.store.published(context, after, self.settle, self.page)
        if not rows:
            out.behind[walk] = 0
            AUDIT_BEHIND.labels(walk).set(0)
            return
        first, head = await self.index.bounds(stream)
        # A row without a sequence (marked by an older relay) is looked for where its neighbours are.
        judged = [r for r in rows if r.stream_seq is None or r.stream_seq >= first]
        seqs = [r.stream_seq for r in judged if r.stream_seq is not None] or [head]
        low, high = max(first, min(seqs) - self.span + 1), max(seqs)
        missing = await self._absent(stream, judged, low, high)
        if missing:  # before saying so, look wider: a row sent again may sit far from its neighbours
            missing = await self._absent(stream, missing, max(first, low - WIDER * self.span),
                                         min(head, high + WIDER * self.span))
        await self._found([Finding(Kind.NOT_IN_STREAM.value, context, r.id, stream, r.stream_seq,
                                   f"published at {r.published_at.isoformat()}, not in {stream}") for r in missing],
                          out)
        last = rows[-1]
        await self.store.save_cursor(walk, Walked(at=last.published_at, id=last.id))
        self._checked(out, walk, len(rows))
        behind = (await self.store.now() - last.published_at).total_seconds() if len(rows) == self.page else 0
        out.behind[walk] = behind
        AUDIT_BEHIND.labels(walk).set(behind)

    async def _absent(self, stream: str, rows: list, low: int, high: int) -> list:
        """The rows whose message is not among the stream's `low`..`high`."""
        present = {m.message_id for m in await self.index.read(stream, low, high)}
        return [r for r in rows if r.id not in present]

    async def _stream(self, context: str, stream: str, out: Round) -> None:
        async def judge(messages: list[Indexed]) -> list[Finding]:
            originals = [m for m in messages if m.message_id and not m.copy]
            have = await self.store.outbox_has([m.message_id for m in originals])
            return [Finding(Kind.OUTBOX_ROW_GONE.value, context, m.message_id, stream, m.seq,
                            f"in {stream} at {m.seq}, and no outbox row has its id") for m in originals
                    if m.message_id not in have]

        first, last = await self.index.bounds(stream)
        await self._walk_stream(f"stream:{context}", stream, first, last, None, judge, out)

    async def _inbox(self, consumer: str, stream: str, durable: str, out: Round) -> None:
        async def judge(messages: list[Indexed]) -> list[Finding]:
            mine = [m for m in messages if m.message_id and m.for_consumer in (None, consumer)]
            done = await self.store.inbox_done(consumer, list({m.message_id for m in mine}))
            return [Finding(Kind.NOT_IN_INBOX.value, consumer, m.message_id, stream, m.seq,
                            f"{stream} {m.seq} is below {durable}'s ack floor, and the inbox has not finished it")
                    for m in mine if m.message_id not in done]

        floor = await self.index.ack_floor(stream, durable)
        if floor is None:  # not made yet (provisioned later): nothing acked
            return
        first, _ = await self.index.bounds(stream)
        await self._walk_stream(f"inbox:{durable}", stream, first, floor,
                                await self.index.filters(stream, durable), judge, out)

    async def _walk_stream(self, walk: str, stream: str, first: int, last: int,
                           subjects: list[str] | None, judge, out: Round) -> None:
        """A page of the stream after the walk's cursor, up to `last`, judged."""
        at = await self.store.cursor(walk)
        if at is None or at.seq is None:
            since = await self.store.now() - timedelta(seconds=self.lookback)
            start = await self.index.seq_at(stream, since)
            at = Walked(seq=(last if start is None else start - 1))
        elif at.seq > last:  # the stream (or the consumer's state) went back: a store rolled back, made again
            log.warning("audit_walk_went_back", walk=walk, was=at.seq, now=last,
                        then="what comes after it now is walked again")
            at = Walked(seq=last)
        low = max(at.seq + 1, first)
        high = min(last, low + self.page - 1)
        if high >= low:
            messages = await self.index.read(stream, low, high, subjects)
            await self._found(await judge(messages), out)
            self._checked(out, walk, len(messages))
        if high >= at.seq:
            await self.store.save_cursor(walk, Walked(seq=max(high, at.seq)))
        out.behind[walk] = max(0, last - max(high, at.seq))
        AUDIT_BEHIND.labels(walk).set(out.behind[walk])

    async def _found(self, findings: list[Finding], out: Round) -> None:
        """Recorded once each; told once per kind and scope, with the first ids (the table has them all)."""
        out.missing += len(findings)
        new = await self.store.found(findings)
        told: dict[tuple[str, str], list[Finding]] = {}
        for f in findings:
            if f.message_id in new:
                out.found.append(f)
                told.setdefault((f.kind, f.scope), []).append(f)
        for (kind, scope), some in told.items():
            AUDIT_FOUND.labels(kind, scope).inc(len(some))
            log.error("audit_found", kind=kind, scope=scope, count=len(some), stream=some[0].stream,
                      message_ids=[str(f.message_id) for f in some[:20]], first=some[0].detail)

    async def _repair(self, context: str, out: Round) -> None:
        """Rows found missing from their stream and not yet published again: published as the relay
        would (`repair:{id}`); one that fails now is tried again next round."""
        rows = await self.store.outbox_rows(await self.store.unrepaired(context, self.page))
        if not rows:
            return
        copies = [repair_copy(self.topology, r) for r in rows]
        sent, failed = [], []
        for r, result in zip(rows, await republish(self.publisher, copies)):
            (sent if result.ok and result.seq else failed).append((r.id, result.seq or result.error))
        await self.store.repaired(context, [i for i, _ in sent], [s for _, s in sent])
        out.repaired += len(sent)
        AUDIT_REPAIRED.labels(context).inc(len(sent))
        if sent:
            log.warning("audit_repaired", context=context, count=len(sent),
                        message_ids=[str(i) for i, _ in sent[:20]], first_seq=sent[0][1])
        if failed:
            log.warning("audit_repair_failed", context=context, count=len(failed), error=str(failed[0][1]),
                        message_ids=[str(i) for i, _ in failed[:20]], then="tried again next round")

    @staticmethod
    def _checked(out: Round, walk: str, count: int) -> None:
        out.checked[walk] = out.checked.get(walk, 0) + count
        AUDIT_CHECKED.labels(walk).inc(count)

