"""Rate-limit partitions in the job store: a job that names a key may start only when its key's
partition (seamq.jobs.limits) says so, decided and written by compare-and-set on one record that
every server reads, so a limit holds across servers as on one.

A fetch asks `admit` before it claims a job: its permit (under a concurrency limit) and its start
are written first; the job's end gives the permit back (`release`, seamq.jobs.admission, after the
end is stored). A handler that reports `rate_limit_until` in its error holds its key until then.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from seamq.jobs import limits, model
from seamq.jobs.job import Job
from seamq.jobs.limits import Policy, Verdict
from seamq.jobs.ports import CAS_TRIES, Conflict, JobStore, Write
from seamq.observability import log

CROWD_SPAN = 30.0  # seconds a job held back counts in its key's crowd here (limits.Verdict.held_for)
PATIENCE_MS, PATIENCE_TRIES = 250, 2  # a start that a window frees this soon is waited for (beyond a worker's idle wait)
KNOWN_KEPT = 10_000  # keys whose last verdict this process remembers
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MS = timedelta(milliseconds=1)


class Limiter:
    def __init__(self, store: JobStore, clock: Callable[[], datetime] = model.utcnow) -> None:
        self.store, self.clock = store, clock
        # A key's last "wait" here, until it may change: a window's or a throttle's until its time (only
        # time frees them; another server's start makes them stricter), a full key's for a short while.
        self._waiting: dict[Policy, tuple[int, Verdict]] = {}
        self._crowds: dict[str, dict[str, float]] = {}  # key -> {job id: when last held back (s)}

    def _now_ms(self) -> int:
        return _ms(self.clock())

    @staticmethod
    def names(job: Job) -> bool:
        """Whether the job names a rate limit key (else `admit` has nothing to say of it)."""
        return limits.policy_of((job.options or {}).get("rate_limit")) is not None

    async def admit(self, job: Job, at: datetime) -> Verdict | None:
        """None when the job names no key; else its key's verdict on its next attempt, stored when it
        may start at `at`. A window or a throttle that frees a start within PATIENCE_MS is waited for
        here (a worker that got nothing fetches again only after its idle wait, so the start would be
        lost to the window); a verdict that keeps losing its compare-and-set to other servers says wait."""
        policy = limits.policy_of((job.options or {}).get("rate_limit"))
        if policy is None:
            return None
        now = _ms(at)  # `at`'s milliseconds, as its started_at says them
        for _ in range(PATIENCE_TRIES):
            verdict = await self._decided(policy, job, now)
            if verdict.strategy == "concurrency" or not 0 < verdict.wait_ms <= PATIENCE_MS:
                break
            await asyncio.sleep(verdict.wait_ms / 1000)
            now = max(now + verdict.wait_ms, self._now_ms())
        return self._counted(verdict, job.id) if verdict.wait_ms else verdict

    def _counted(self, verdict: Verdict, job_id: str) -> Verdict:
        """The verdict with its key's crowd: the jobs held back on it here in the last CROWD_SPAN."""
        if len(self._crowds) >= KNOWN_KEPT and verdict.key not in self._crowds:
            self._crowds.clear()
        crowd, now = self._crowds.setdefault(verdict.key, {}), self._now_ms() / 1000
        crowd.pop(job_id, None)
        crowd[job_id] = now  # in the order they were last held back: the oldest go first
        while (oldest := next(iter(crowd.items())))[1] < now - CROWD_SPAN:
            del crowd[oldest[0]]
        return verdict._replace(crowd=len(crowd))

    async def _decided(self, policy: Policy, job: Job, now: int) -> Verdict:
        key = limits.record_key(policy.key)
        if (waiting := self._waiting.get(policy)) is not None and waiting[0] > now:
            return waiting[1]._replace(wait_ms=waiting[0] - now)
        for _ in range(CAS_TRIES):
            held = await self.store.get(key)
            partition = held.record if held else None
            verdict = limits.admit(policy, partition, job.id, job.attempt + 1, now)
            if verdict.strategy == "concurrency" and partition:
                verdict = await self._without_stale(policy, partition, job, now) or verdict
            if verdict.wait_ms:
                if len(self._waiting) >= KNOWN_KEPT:
                    self._waiting.clear()
                memo = verdict.wait_ms if verdict.strategy != "concurrency" else limits.CONCURRENCY_WAIT_MS // 2
                self._waiting[policy] = (now + memo, verdict)
                return verdict
            try:
                await self.store.commit([Write(key, verdict.partition, held.revision if held else 0, finished=True)])
                return verdict
            except Conflict:
                continue
        return Verdict(limits.CONCURRENCY_WAIT_MS, {}, "contention", key=policy.key, on_limit=policy.on_limit)

    async def _without_stale(self, policy: Policy, partition: dict, job: Job, now: int) -> Verdict | None:
        """A full key's verdict again without the permits whose jobs do not hold them (their records
        as stored say so); None when every permit is held."""
        held = await self.store.get_many(list(partition.get("active") or {}))
        gone = limits.stale(partition, {k: s.record for k, s in held.items()}, now)
        if not gone:
            return None
        log.info("rate_limit_permits_dropped", key=policy.key, jobs=gone)  # most ended, their release on its way
        live = {k: v for k, v in partition["active"].items() if k not in gone}
        return limits.admit(policy, {**partition, "active": live}, job.id, job.attempt + 1, now)

    async def release(self, job: Job) -> None:
        """The job stopped running (its end or its release is stored): its permit goes back, and an
        error saying `rate_limit_until` holds its key until then."""
        policy = limits.policy_of((job.options or {}).get("rate_limit"))
        if policy is None:
            return
        until = _until((job.error or {}).get("rate_limit_until"))
        key = limits.record_key(policy.key)
        for _ in range(CAS_TRIES):
            held = await self.store.get(key)
            if held is None:
                return
            partition = limits.released(held.record, job.id, job.attempt) or dict(held.record)
            if until is not None:
                partition["paused_until_ms"] = max(until, partition.get("paused_until_ms", 0))
            if partition == held.record:
                return
            try:
                await self.store.commit([Write(key, partition, held.revision, finished=True)])
                return
            except Conflict:
                continue
        log.warning("rate_limit_release_lost", key=policy.key, job_id=job.id)  # dropped as stale when the key is full

    def forget(self) -> None:
        """The store was wiped (test mode's reset)."""
        self._waiting.clear()
        self._crowds.clear()

    async def learn(self, record: dict) -> None:
        """A new job names a key: its partition exists from now on, to be inspected before any job of it ran."""
        policy = limits.policy_of((record.get("options") or {}).get("rate_limit"))
        if policy is None:
            return
        key = limits.record_key(policy.key)
        if await self.store.get(key) is None:
            try:
                await self.store.commit([Write(key, {"_kind": "rate_limit", "key": policy.key, "policy": policy.public()},
                                               0, finished=True)])
            except Conflict:
                pass  # made meanwhile by another job of the key

    async def headers(self, record: dict) -> dict[str, str]:
        """X-RateLimit-* of a new job's key as it stands (the answer to its enqueue); none without a key."""
        policy = limits.policy_of((record.get("options") or {}).get("rate_limit"))
        if policy is None:
            return {}
        held = await self.store.get(limits.record_key(policy.key))
        return limits.headers(policy, held.record if held else None, self._now_ms())

    async def inspect(self, key: Any) -> dict:
        if not isinstance(key, str) or not limits.KEY_PATTERN.fullmatch(key):
            raise model.invalid(f"a rate limit key matches {limits.KEY_PATTERN.pattern}")
        held = await self.store.get(limits.record_key(key))
        if held is None:
            raise model.OjsError(404, "not_found", f"no job has named rate limit key {key!r} (or not within 7 days)")
        return _shown(limits.public(held.record, self._now_ms()))

    async def listing(self) -> list[dict]:
        now = self._now_ms()
        return sorted((_shown(limits.public(s.record, now)) for s in await self.store.scan("rl.")), key=lambda r: r["key"])

    async def override(self, key: Any, body: Any) -> dict:
        """PUT /rate-limits/{key}: the key's concurrency set by hand (0 holds all its jobs) until
        `expires_at`, or for good without it; `{"concurrency": null}` ends an override."""
        if not isinstance(body, dict) or set(body) - {"concurrency", "expires_at"} or "concurrency" not in body:
            raise model.invalid('send {"concurrency": N or null, "expires_at": RFC 3339 time (optional)}')
        concurrency, ends = body["concurrency"], body.get("expires_at")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0):
            raise model.invalid("concurrency must be an integer of 0 or more, or null")
        until = int(model.parse_time(ends).timestamp() * 1000) if isinstance(ends, str) else 0
        if ends is not None and not isinstance(ends, str):
            raise model.invalid("expires_at must be an RFC 3339 time")
        record = limits.record_key(key if isinstance(key, str) and limits.KEY_PATTERN.fullmatch(key) else "")
        if record == "rl.":
            raise model.invalid(f"a rate limit key matches {limits.KEY_PATTERN.pattern}")
        for _ in range(CAS_TRIES):
            held = await self.store.get(record)
            partition = dict(held.record) if held else {"_kind": "rate_limit", "key": key}
            partition.pop("override", None)
            if concurrency is not None:
                partition["override"] = {"concurrency": concurrency, "until_ms": until}
            try:
                await self.store.commit([Write(record, partition, held.revision if held else 0, finished=True)])
                return _shown(limits.public(partition, self._now_ms()))
            except Conflict:
                continue
        raise model.conflict(f"rate limit {key} kept changing; try again")


def _ms(moment: datetime) -> int:
    return (moment - EPOCH) // MS


def _until(text: Any) -> int | None:
    try:
        return int(model.parse_time(text).timestamp() * 1000) if isinstance(text, str) else None
    except model.OjsError:
        return None


def _shown(view: dict) -> dict:
    """Times as RFC 3339, as every other answer says them."""
    out: dict[str, Any] = {}
    for name, value in view.items():
        if isinstance(value, dict):
            value = {k[:-3] if k.endswith("_ms") else k: model.iso(datetime.fromtimestamp(v / 1000, model.utcnow().tzinfo))
                     if k.endswith("_at_ms") else v for k, v in value.items()}
        out[name] = value
    return out
