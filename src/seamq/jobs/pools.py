"""Worker pools (OJS fair scheduling): how a fetch that names several queues of a pool shares its
count between them. No I/O.

Without a pool a fetch takes from its queues in the order named, the first first (the worker
protocol's queue priority, `strict`). A pool's `round-robin` gives each of its queues an equal share
of a fetch, `weighted` a share by weight, the queue served first moving on at each fetch so that
none waits on the rounding; what a queue could not fill goes to the others after.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$")
STRATEGIES = ("strict", "round-robin", "weighted")


@dataclass(frozen=True)
class Pool:
    name: str
    queues: tuple[str, ...]
    strategy: str = "round-robin"
    weights: tuple[tuple[str, int], ...] = ()
    concurrency: int | None = None

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "queues": list(self.queues), "strategy": self.strategy}
        if self.weights:
            out["weights"] = dict(self.weights)
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        return out

    def record(self) -> dict[str, Any]:
        return {"_kind": "pool", **self.public()}


def pool_of(name: str, body: Any, check_queue: Any) -> Pool:
    """A pool from `PUT /admin/pools/{name}`: the spec's `queues: [...]` with `weights: {q: n}`, or the
    suite's `queues: {q: {weight: n}}`. Raises ValueError with the reason."""
    if not NAME.fullmatch(name):
        raise ValueError(f"a pool's name matches {NAME.pattern}")
    if not isinstance(body, dict) or body.get("name", name) != name:
        raise ValueError("send the pool as an object; its name, if given, is the path's")
    queues, weights = body.get("queues"), body.get("weights") or {}
    if isinstance(queues, dict):
        weights = {q: (w or {}).get("weight", 1) if isinstance(w, dict) else w for q, w in queues.items()}
        queues = list(queues)
    if not isinstance(queues, list) or not queues or len(queues) > 100:
        raise ValueError("queues: a list of 1 to 100 queue names (or an object of them with their weights)")
    names = tuple(check_queue(q) for q in queues)
    if not isinstance(weights, dict) or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in weights.values()) \
            or set(weights) - set(names):
        raise ValueError("weights: a positive integer for a queue of the pool")
    strategy = body.get("strategy", "weighted" if weights else "round-robin")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} (least-loaded is not built)")
    concurrency = body.get("concurrency")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError("concurrency must be a positive integer")
    return Pool(name, names, strategy, tuple((q, int(weights.get(q, 1))) for q in names if weights), concurrency)


def from_record(record: dict[str, Any]) -> Pool:
    return Pool(record["name"], tuple(record["queues"]), record["strategy"], tuple((record.get("weights") or {}).items()),
                record.get("concurrency"))


def shares(queues: list[str], count: int, pool: Pool | None, turn: int) -> list[tuple[str, int]]:
    """(queue, up to how many) in the order a fetch takes them: its share of each queue first, then each
    queue again for what the others left."""
    if pool is None or pool.strategy == "strict" or len(queues) < 2:
        return [(queue, count) for queue in queues]
    weights = dict(pool.weights) if pool.strategy == "weighted" else {}
    start = turn % len(queues)
    order = queues[start:] + queues[:start]
    total = sum(weights.get(q, 1) for q in order)
    first = [(q, max(1, count * weights.get(q, 1) // total)) for q in order]
    return first + [(q, count) for q in order]
