"""A producer's outbox writes, run by whichever seamq is on PYTHONPATH (this version's, or the
previous release's for bench/scale.py): `count` events, `per_tx` per transaction, UUIDv7 ids
(seamq's) or UUIDv4 ones. Prints the time per event as JSON.

    python bench/probes/producer.py DSN COUNT PER_TX v7|v4 KIND
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid

import psycopg

from seamq import outbox
from seamq.model import Event


def main(dsn: str, count: int, per_tx: int, ids: str, kind: str) -> None:
    times = []
    with psycopg.connect(dsn) as conn:
        for first in range(0, count, per_tx):
            events = [Event(context="sea", aggregate_type="order", aggregate_id=f"o-{n % 1000}",
                            event_type="order_placed", payload={"n": n, "kind": kind},
                            **({"id": uuid.uuid4()} if ids == "v4" else {}))
                      for n in range(first, min(count, first + per_tx))]
            began = time.perf_counter()
            with conn.transaction():
                outbox.add_many(conn, events)
            times.append((time.perf_counter() - began) / len(events))
    times.sort()
    print(json.dumps(dict(per_event_us_p50=round(statistics.median(times) * 1e6, 1),
                          per_event_us_p99=round(times[int(len(times) * 0.99)] * 1e6, 1))))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
