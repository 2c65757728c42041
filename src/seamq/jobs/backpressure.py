"""Queue bounds (`ext-backpressure`): a queue may hold at most `max_depth` jobs not yet run (available,
scheduled or retryable), and an enqueue that would pass the bound is refused with 429 `QUEUE_FULL`
(the spec's `reject`, its default and recommended strategy), so a producer slows down instead of a
queue growing without end. No I/O here: the bound as configured, and what an enqueue meets.

The bound is checked against the counts as they are read before the jobs are written: enqueues that
race through several servers may pass it by as many jobs as are on their way at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seamq.jobs.model import WAITING, OjsError, invalid  # WAITING: the spec's depth, what is neither running nor finished
RETRY_AFTER = 5  # seconds a refused producer is told to wait


@dataclass(frozen=True)
class Bound:
    max_depth: int
    warning_threshold: float = 0.8

    def public(self) -> dict[str, Any]:
        return {"max_depth": self.max_depth, "strategy": "reject", "warning_threshold": self.warning_threshold}


def bound_of(body: Any) -> Bound | None:
    """From `PUT /admin/queues/{name}/config`'s `backpressure`; None: unbounded (`max_depth` 0)."""
    if not isinstance(body, dict):
        raise invalid("backpressure must be an object: {\"max_depth\": N, \"strategy\": \"reject\"}")
    depth, strategy = body.get("max_depth", 0), body.get("strategy", "reject")
    threshold = body.get("warning_threshold", 0.8)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise invalid("backpressure.max_depth must be a non-negative integer (0: unbounded)")
    if strategy != "reject":
        raise invalid(f"backpressure.strategy {strategy!r} is not supported: seamq refuses an enqueue past the "
                      "bound (reject); block and drop_oldest are not built")
    if body.get("max_size_bytes"):
        raise invalid("backpressure.max_size_bytes is not supported: bound the queue by max_depth")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise invalid("backpressure.warning_threshold must be a number from 0 to 1")
    return Bound(depth, float(threshold)) if depth else None


def depth(counts: dict[str, int]) -> int:
    return sum(counts[state.value] for state in WAITING)


def admitted(queue: str, bound: Bound, now_deep: int, adding: int) -> None:
    """Refuse `adding` jobs that would take the queue past its bound (a batch whole, never in part)."""
    if now_deep + adding > bound.max_depth:
        raise OjsError(429, "QUEUE_FULL", f"queue {queue!r} has reached its depth bound ({bound.max_depth}): "
                                          f"{now_deep} waiting, {adding} more asked; try again later",
                       type="rate_limit", details={"queue": queue, "depth": now_deep, "bound": bound.max_depth,
                                                   "strategy": "reject", "retry_after": RETRY_AFTER},
                       headers=headers(bound, now_deep, True))


def headers(bound: Bound, now_deep: int, refused: bool) -> dict[str, str]:
    """What a producer is told of the queue's pressure: on a refusal, and past the warning threshold."""
    if not refused and now_deep < bound.warning_threshold * bound.max_depth:
        return {}
    said = {"X-OJS-Queue-Depth": str(now_deep), "X-OJS-Queue-Bound": str(bound.max_depth),
            "X-OJS-Queue-Pressure": f"{min(now_deep / bound.max_depth, 1.0):.2f}"}
    return {**said, "Retry-After": str(RETRY_AFTER)} if refused else said
