"""Queues: their pause flags, maintenance mode, rate limits and counts, for servers that share a store.

The flags and limits are a handful of records every server needs on each fetch:
each server follows them (seamq.jobs.ports.JobStore.follow), so a pause made
through any server holds on every other one as soon as the change reaches it
(milliseconds), without a read per fetch. A rate limit is a token bucket kept
in the store and taken by compare-and-set, so it holds across servers.

Counts are read from where the jobs are, not from an index: waiting and held
entries of the ready order (available, active), armed timers (scheduled,
retryable) and the log of finished jobs (completed, discarded, cancelled,
within the retention period). A job cancelled while available is counted
available until a fetch of its queue meets its entry and drops it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

from seamq.jobs import backpressure, model, pools, tally, tenants
from seamq.jobs.model import conflict, iso
from seamq.jobs.ports import Conflict, JobStore, Write
from seamq.jobs.recounts import Recounts
from seamq.observability import log
from seamq.model import describe

MAINTENANCE = "system.maintenance"
FOLLOWED = ["queue.", "system.", "limit.", "schema.", "worker.", "webhook.", "pool."]
LOOKED_MOST = 10_000  # queues remembered as read once (then forgotten together, and read again)
TRIES = 5  # compare-and-set of a rate bucket racing other servers


def queue_key(queue: str) -> str:
    return f"queue.{queue}"


def worker_key(worker_id: str) -> str:
    return f"worker.{worker_id.encode().hex()}"


class Queues:
    def __init__(self, store: JobStore, clock: Callable = model.utcnow, recounts: Recounts | None = None) -> None:
        self.store, self.clock, self.recounts = store, clock, recounts  # counts read once those from here land
        self.flags: dict[str, dict] = {}  # the followed records, by key
        self._looked: set[str] = set()  # queues whose record was read here once (Queues._known)
        self._turns = itertools.count()  # which queue of a pool a fetch serves first
        self.ready = asyncio.Event()

    async def follow(self) -> None:
        """Keep `flags` as the store has them, until cancelled (restarted if the store's watch ends)."""
        while True:
            seen: set[str] | None = set()  # the records there at the start of this pass, until all came
            try:
                async for key, record in self.store.follow(FOLLOWED):
                    if not key:  # what was there has all come: what was not was deleted while unheard
                        for gone in set(self.flags) - seen:
                            self.flags.pop(gone, None)
                        seen = None
                        self.ready.set()
                        continue
                    if seen is not None:
                        seen.add(key)
                    if record is None:
                        self.flags.pop(key, None)
                    else:
                        self.flags[key] = record
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects; follow again from the start
                log.warning("ojs_follow_failed", error=describe(exc))
            await asyncio.sleep(0.5)

    def kept(self, key: str, record: dict | None) -> None:
        """A followed record this server wrote: known here at once, before its change comes back."""
        if record is None:
            self.flags.pop(key, None)
        else:
            self.flags[key] = record

    def of(self, prefix: str) -> list[dict]:
        return [r for k, r in list(self.flags.items()) if k.startswith(prefix)]

    # ---- pause, maintenance -----------------------------------------------------------------------

    def paused(self, queue: str) -> bool:
        return bool((self.flags.get(queue_key(queue)) or {}).get("paused")) or \
            bool((self.flags.get(MAINTENANCE) or {}).get("enabled"))

    async def paused_now(self, queue: str) -> bool:
        """`paused`, a pause known here read again first: a resume through another server a moment ago
        holds here before its change comes (a fetch of a paused queue costs a read; any other, nothing)."""
        if not self.paused(queue):
            return False
        held = await self.store.get(key := queue_key(queue))
        self.kept(key, held.record if held else None)
        return self.paused(queue)

    async def _put(self, key: str, change: Callable[[dict | None], dict], what: str) -> None:
        """A followed record changed from what is stored (`change` of it, or of None), by CAS."""
        held = await self.store.get(key)
        record = change(held.record if held else None)
        try:
            await self.store.commit([Write(key, record, held.revision if held else 0)])
        except Conflict:
            raise conflict(f"{what} changed meanwhile; read it again") from None
        self.kept(key, record)

    async def set_paused(self, queue: str, paused: bool) -> dict:
        await self._queue(queue, paused=paused)
        return {"name": queue, "paused": paused}

    async def configure(self, queue: str, bound: backpressure.Bound | None) -> None:
        await self._queue(queue, backpressure=bound.public() if bound else None)

    async def _queue(self, queue: str, **fields: Any) -> None:
        """A queue's record (its flag and its bound), changed in the fields given."""
        key = queue_key(model.check_queue(queue))
        await self._put(key, lambda held: {"paused": False, **(held or {}), "_key": key, "_kind": "queue", "name": queue,
                                           **fields}, f"queue {queue}")

    def bound(self, queue: str) -> backpressure.Bound | None:
        held = (self.flags.get(queue_key(queue)) or {}).get("backpressure")
        return backpressure.Bound(held["max_depth"], held["warning_threshold"]) if held else None

    async def bounded(self, records: list[dict]) -> None:
        """Refuse jobs that would take a bounded queue past its bound (seamq.jobs.backpressure)."""
        adding: dict[str, int] = {}
        for record in records:
            adding[record["queue"]] = adding.get(record["queue"], 0) + 1
        for queue, count in adding.items():
            await self._known(queue)
            if (bound := self.bound(queue)) is not None:
                backpressure.admitted(queue, bound, backpressure.depth(await self.stats(queue)), count)

    async def _known(self, queue: str) -> None:
        """A queue's record read once from the store when this server follows none: a bound set through
        another server a moment ago holds here before the change reaches this server."""
        key = queue_key(queue)
        if key in self.flags or queue in self._looked:
            return
        if len(self._looked) >= LOOKED_MOST:
            self._looked.clear()
        self._looked.add(queue)
        if (held := await self.store.get(key)) is not None:
            self.kept(key, held.record)

    async def said_stored(self, worker_id: str) -> dict | None:
        """What a worker said as stored, for one this server has not heard of yet."""
        if len(worker_id) > 255:  # no beat names one so long
            return None
        held = await self.store.get(worker_key(worker_id))
        return held.record if held else None

    async def pressure(self, queue: str) -> dict[str, str]:
        """The headers an enqueue's answer carries past a bounded queue's warning threshold."""
        bound = self.bound(queue)
        return backpressure.headers(bound, backpressure.depth(await self.stats(queue)), False) if bound else {}

    def said_by(self, worker_id: object) -> dict | None:
        """What a worker last said of itself (graceful shutdown) through any server."""
        return self.flags.get(worker_key(worker_id)) if isinstance(worker_id, str) and worker_id else None

    async def say(self, worker_id: str, said: str, at: str) -> None:
        """Kept for every server to follow, so a drain said through one holds on the others (and an end,
        so that each knows a fetch after it is a new life); for the records' retention at most."""
        key = worker_key(worker_id)
        record = {"_key": key, "_kind": "worker", "id": worker_id, "said": said, "at": at}
        await self.store.commit([Write(key, record, None, finished=True)])
        self.kept(key, record)

    def maintenance(self) -> dict:
        held = self.flags.get(MAINTENANCE)
        return {k: v for k, v in held.items() if not k.startswith("_")} if held else {"enabled": False}

    async def set_maintenance(self, enabled: bool, reason: str | None, ends_at: str | None) -> dict:
        """No fetch gets a job, from any queue, until it ends; jobs are still accepted, and scheduled
        ones become available on time, to run when it ends."""
        record = {"_key": MAINTENANCE, "_kind": "system", "enabled": enabled, "reason": reason,
                  "started_at": iso(self.clock()) if enabled else None, "ends_at": ends_at if enabled else None}
        await self._put(MAINTENANCE, lambda held: record, "maintenance mode")
        return self.maintenance()

    # ---- pools (fair scheduling) --------------------------------------------------------------------

    def pools(self) -> list[pools.Pool]:
        return sorted((pools.from_record(r) for r in self.of("pool.")), key=lambda p: p.name)

    async def set_pool(self, pool: pools.Pool | None, name: str) -> None:
        """A pool made, changed or (None) deleted, for every server to follow."""
        key = f"pool.{name}"
        await self.store.commit([Write(key, pool.record() if pool else None, None)])
        self.kept(key, pool.record() if pool else None)

    def shares(self, queues: list[str], count: int) -> list[tuple[str, int]]:
        """How a fetch of `queues` takes `count`: by the first pool (by name) that holds them all, else
        in the order named (seamq.jobs.pools)."""
        pool = next((p for p in self.pools() if set(queues) <= set(p.queues)), None) if len(queues) > 1 else None
        return pools.shares(queues, count, pool, next(self._turns))

    # ---- rate limits ------------------------------------------------------------------------------

    async def learn(self, record: dict) -> None:
        """A job that names `options.rate_limit` sets its queue's rate (the latest one named wins)."""
        limit = (record.get("options") or {}).get("rate_limit")
        if not isinstance(limit, dict) or "max_per_second" not in limit:  # a key's limit is seamq.jobs.limiter's
            return
        key, rate = f"limit.{record['queue']}", float(limit["max_per_second"])
        if (self.flags.get(key) or {}).get("rate") != rate:
            await self.store.commit([Write(key, {"_key": key, "_kind": "limit", "queue": record["queue"],
                                                 "rate": rate}, None)])
            self.kept(key, {"_key": key, "rate": rate})

    def limited(self, queue: str) -> float | None:
        return (self.flags.get(f"limit.{queue}") or {}).get("rate")

    async def take_tokens(self, queue: str, wanted: int) -> int:
        """Up to `wanted` of the queue's tokens: its bucket starts full, holds max(1, rate) and fills
        at `rate` per second; what is granted is spent whether or not the queue had as many jobs."""
        rate = self.limited(queue)
        if rate is None:
            return wanted
        key, capacity = f"tokens.{queue}", max(1.0, rate)
        for _ in range(TRIES):
            now = self.clock().timestamp()
            held = await self.store.get(key)
            tokens = capacity if held is None else min(capacity, held.record["tokens"] + (now - held.record["at"]) * rate)
            granted = min(wanted, int(tokens))
            try:
                await self.store.commit([Write(key, {"_key": key, "_kind": "tokens", "tokens": tokens - granted,
                                                     "at": now}, held.revision if held else 0)])
                return granted
            except Conflict:
                continue
        return 0

    async def give_back(self, queue: str, unused: int) -> None:
        """Tokens granted for jobs the queue did not have are not spent."""
        if unused <= 0 or self.limited(queue) is None:
            return
        key = f"tokens.{queue}"
        for _ in range(TRIES):
            held = await self.store.get(key)
            if held is None:
                return
            try:
                await self.store.commit([Write(key, {**held.record, "tokens": held.record["tokens"] + unused}, held.revision)])
                return
            except Conflict:
                continue

    # ---- counts -----------------------------------------------------------------------------------

    async def stats(self, queue: Any, tenant: str | None = None) -> dict:
        """A queue's counts; a tenant's jobs in it alone when `tenant` names one."""
        queue = model.check_queue(queue)
        counted = tenants.tally_queue(queue, tenant) if tenant else queue
        if self.recounts is not None:
            await self.recounts.drained()
        counts = tally.summed([record for record, _ in (await self.store.get_many(tally.keys(counted))).values()],
                              self.clock())
        bound = self.bound(queue)
        return {"name": queue, **{state: counts[state] for state in model.STATES}, "paused": self.paused(queue),
                "depth": backpressure.depth(counts), **({"max_depth": bound.max_depth} if bound else {})}

    async def tallied(self) -> dict[str, dict[str, int]]:
        """Each tally's name (a queue's own, or a tenant's in a queue: tenants.tally_queue) and its counts:
        one pass over the tallies, which a listing reads once however many queues and tenants it shows."""
        held: dict[str, list[dict]] = {}
        if self.recounts is not None:
            await self.recounts.drained()
        for record, _ in await self.store.scan("tally."):
            held.setdefault(record.get("queue", ""), []).append(record)
        now = self.clock()
        return {name: tally.summed(records, now) for name, records in held.items()}

    @staticmethod
    def tenant_stats(tenant: str, tallied: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """A tenant's counts in each queue that holds or held its jobs (within the retention period)."""
        return {found[0]: counts for name, counts in tallied.items()
                if (found := tenants.from_tally(name)) and found[1] == tenant and any(counts.values())}

    @staticmethod
    def tenant_names(tallied: dict[str, dict[str, int]]) -> list[str]:
        """Every tenant with a tally in some queue."""
        return sorted({found[1] for name in tallied if (found := tenants.from_tally(name))})

    async def names(self, tallied: dict[str, dict[str, int]] | None = None) -> list[str]:
        """Every queue that was offered jobs, counts a job (finished ones within the retention period) or
        has flags, and `default`."""
        tallied = await self.tallied() if tallied is None else tallied
        counted = [name for name, counts in tallied.items() if not tenants.from_tally(name) and any(counts.values())]
        return sorted({model.DEFAULT_QUEUE, *await self.store.queues(), *counted, *(r["name"] for r in self.of("queue."))})

    async def listing(self) -> list[dict]:
        return [{"name": name, "status": "paused" if self.paused(name) else "active", "paused": self.paused(name)}
                for name in await self.names()]
