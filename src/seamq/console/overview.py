"""The overview's numbers: what PostgreSQL and JetStream hold now, and a few minutes of history.

Every number is read where it lives, through indexed ranges only (the last minute of processed
rows, the open dead letters, the unpublished outbox rows), so the page answers in milliseconds
however large the inbox grows (docs/console.md, "How fast"). The history behind the charts is
sampled by the console itself every few seconds and kept for `KEEP` samples in memory: a chart of
the last minutes, not a metrics store (Prometheus is, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from typing import Any, Protocol

from seamq.model import describe
from seamq.observability import log
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology


class OverviewReader(Protocol):
    """Where the numbers live (seamq.doors.OverviewReader): PostgreSQL's at once, JetStream's once joined."""

    @property
    def nats_up(self) -> bool: ...

    async def tables(self) -> Any: ...

    async def durable(self, stream: str, durable: str, *, timeout: float) -> dict[str, Any]: ...

    async def members(self, consumer: str) -> list[dict[str, Any]]: ...

NATS_DOWN = "NATS (SEAMQ_NATS__URL): not connected; JetStream's numbers are unknown until it is back"
KEEP = 120  # samples per consumer: ten minutes at one every five seconds
EVERY = 5.0
ASK_NATS = 2.0  # at most, per consumer read: a slow NATS shows as unknown, never as a slow page


@dataclass
class Snapshot:
    at: float
    contexts: list[dict]
    consumers: list[dict]
    processes: list[dict]
    errors: list[str] = field(default_factory=list)


class Overview:
    def __init__(self, reader: OverviewReader, topology: Topology) -> None:
        """`reader`: PostgreSQL's numbers at once, JetStream's once it has joined NATS (unknown till then)."""
        self.reader, self.topology = reader, topology
        self.history: dict[str, deque] = {}
        self.holders: dict[str, str] = {}  # partition (durable) -> the process holding it

    async def snapshot(self) -> Snapshot:
        errors: list[str] = []
        contexts, inbox, processes = [], {}, []
        try:
            tables = await self.reader.tables()
            contexts, published, inbox, processes = tables.contexts, tables.published, tables.inbox, tables.processes
        except Exception as exc:  # the page says so; it does not fail
            errors.append(f"PostgreSQL: {describe(exc)}")
            published = {}
        known = {c["context"] for c in contexts}
        contexts += [{"context": name, "count": 0, "oldest_at": None, "failing": 0, "delayed": 0, "parked": 0}
                     for name in self.topology.contexts if name not in known]
        for row in contexts:
            row["published_per_s"] = published.get(row["context"], 0) / 60
        contexts.sort(key=lambda r: r["context"])
        consumers = []
        for name, spec in sorted(self.topology.consumers.items()):
            row = {"consumer": name, "handled": 0, "p50": None, "p99": None, "replayed": 0, "replay_p99": None,
                   "dead_open": 0, "dead_last_hour": 0, **inbox.get(name, {})}
            row["handled_per_s"] = row["handled"] / 60
            durables = [await self._durable(spec.stream, durable, errors) for durable in spec.durables()]
            # A number JetStream did not give is unknown (None, shown so), never a zero.
            row.update({key: None if None in durables else sum(d[key] for d in durables)
                        for key in ("pending", "ack_pending", "redelivered", "waiting")},
                       durables=[d for d in durables if d is not None])
            consumers.append(row)
        return Snapshot(time.time(), contexts, consumers, processes, errors)

    async def _durable(self, stream: str, durable: str, errors: list[str]) -> dict | None:
        """One durable's numbers as JetStream has them; None when it cannot say. Not asked while the
        connection is down: the page answers from what it has instead of waiting out a request."""
        if not self.reader.nats_up:
            if NATS_DOWN not in errors:
                errors.append(NATS_DOWN)
            return None
        try:
            numbers = await self.reader.durable(stream, durable, timeout=ASK_NATS)
        except Exception as exc:
            errors.append(f"JetStream: consumer {durable}: {describe(exc)}")
            return None
        return {"name": durable, **numbers, "held_by": self.holders.get(durable)}

    async def refresh_holders(self) -> None:
        """Which process holds each partition, as each process says (seamq.nats.partitions). Asked by the
        sampler, not by a page: every ask waits a moment for the answers."""
        if not self.reader.nats_up:
            return
        held = {}
        for name, spec in self.topology.consumers.items():
            if spec.partitions:
                held.update({d: m["process"] for m in await self.reader.members(name) for d in m.get("holds") or []})
        self.holders = held

    async def sample(self, stop: asyncio.Event) -> None:
        """Keep the charts' history, and who holds which partition, until `stop`."""
        while not stop.is_set():
            try:
                await self.refresh_holders()
                shot = await self.snapshot()
                for row in shot.consumers:
                    self.history.setdefault(row["consumer"], deque(maxlen=KEEP)).append(
                        (shot.at, row["handled_per_s"], row["p50"], row["p99"]))
            except Exception as exc:
                log.warning("console_sample_failed", error=describe(exc))
            await sleep_unless_stopped(stop, EVERY)


def sparkline(points: list[float | None], width: int = 240, height: int = 48) -> str:
    """SVG polyline points for a small chart; gaps (None) are drawn as zero."""
    values = [p or 0.0 for p in points]
    if not values:
        return ""
    top = max(values) or 1.0
    step = width / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - v / top * (height - 2) - 1:.1f}" for i, v in enumerate(values))
