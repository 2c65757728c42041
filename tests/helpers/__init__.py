"""Test helpers that read what really happened: stream contents, table counts."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psycopg
from nats.errors import NoRespondersError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import ServiceUnavailableError

HELPERS = Path(__file__).resolve().parent  # tests/helpers: harnesses, handlers and fixtures' files
TESTS = HELPERS.parent  # tests/: <tier>/<part>/test_*.py (tests/conftest.py takes the tier from the folder)
ROOT = TESTS.parent  # the checkout

SEAMQ = [sys.executable, "-m", "seamq"]  # the command, as the installed package runs it

# A topology whose duplicate window and ack_wait are short enough for a test to wait them out.
FAST_TOPOLOGY = """
contexts:
  sea:
    stream: {duplicate_window: 1s}
  vibespro:
    stream: {duplicate_window: 1s}
consumers:
  sea__from_vibespro: {ack_wait: 2s, max_deliver: 4, max_ack_pending: 50}
"""

def spark_scratch(folder) -> dict[str, str]:
    """Spark settings that keep a driver's scratch (local dir, temp files) in `folder`, for a JVM
    that will not get to clean up /tmp itself."""
    return {"spark.local.dir": str(folder), "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={folder}"}


# A cluster's topology for node-loss and partition tests: redeliveries during a failover must not
# use up max_deliver (a node lost is not a handler's fault), and ack_wait is short enough to wait out.
FAILOVER_TOPOLOGY = """
contexts:
  sea: {}
  vibespro: {}
consumers:
  sea__from_vibespro: {ack_wait: 10s, max_deliver: 20, max_ack_pending: 500}
"""


async def read_stream(js, stream: str, subject: str = ">", timeout: float = 120.0) -> list:
    """Every message in a stream, in stream order, through an ack-less pull consumer; fewer than the
    stream holds within `timeout` (a liveness bound: a busy machine is slow) is an error, never a
    shorter list that a caller would take for the stream's content."""
    deadline = time.monotonic() + 60
    while True:  # a cluster that just lost nodes, on a busy machine, can take more than a request's 5 s
        try:
            info = await js.stream_info(stream)
            break
        except (asyncio.TimeoutError, ServiceUnavailableError, NoRespondersError):
            assert time.monotonic() < deadline, f"no answer about stream {stream} for a minute"
            await asyncio.sleep(0.5)
    total = info.state.messages
    if total == 0:
        return []
    sub = await js.pull_subscribe(
        subject, stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30),
    )
    messages = []
    deadline = time.monotonic() + timeout
    try:
        while len(messages) < total and time.monotonic() < deadline:
            try:
                messages += await sub.fetch(min(1000, total - len(messages)), timeout=2)
            except asyncio.TimeoutError:
                pass
            except (ServiceUnavailableError, NoRespondersError):
                # In a cluster the new consumer's leader may not be known on our route yet (the request
                # reached no one, so nothing was delivered): ask again
                await asyncio.sleep(0.1)
    finally:
        await sub.unsubscribe()
    assert len(messages) >= total, f"read {len(messages)} of the {total} messages of {stream} in {timeout:.0f} s"
    return messages


async def wait_while_moving(count, target: int, still: float, what: str, interval: float = 0.2) -> None:
    """Poll `count()` until it reaches `target`; fail only once it has not grown for `still` seconds (a
    stall), however long the whole takes: how fast a busy machine gets there is not the question."""
    seen, moved = -1, time.monotonic()
    while (now := count()) < target:
        if now > seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > still:
            raise AssertionError(f"{what}: stuck at {now} of {target} for {still:.0f}s")
        await asyncio.sleep(interval)


async def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll an async or sync predicate until truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def freeze(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP a process and return once every thread of it has stopped. kill() returns before that:
    the stop is carried out by one thread and then by each of the others, which on a busy machine
    ran on for milliseconds (a frozen nats-server follower still acked a leader's proposals)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not all(state in "tT" for state in _thread_states(pid)):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped {timeout}s after SIGSTOP")
        time.sleep(0.001)


def _thread_states(pid: int) -> list[str]:
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):  # a thread that ended meanwhile
            continue
    return states


def scalar(dsn: str, sql: str, params=None):
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchone()[0]


def fetch_one(dsn: str, sql: str, params=None):
    """One row of a query, on a connection closed before it returns."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchone()


def fetch_all(dsn: str, sql: str, params=None) -> list:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


GAPS = ("SELECT extract(epoch FROM prev), extract(epoch FROM t) FROM (SELECT t, lag(t) OVER (ORDER BY t) AS prev "
        "FROM (SELECT {column} AS t FROM {table} WHERE {column} IS NOT NULL) w) g WHERE t - prev > interval '1 second'")


def longest_pause(dsn: str, column: str, table: str, began: float = float("-inf"), ended: float = float("inf")) -> float:
    """The longest time (over a second) nothing was published or handled (`column` of `table`, a
    timestamp) that overlaps the span from `began` to `ended` (epoch seconds): a fault's."""
    with psycopg.connect(dsn) as conn:
        gaps = conn.execute(GAPS.format(column=column, table=table)).fetchall()
    return max((float(t - prev) for prev, t in gaps if prev < ended and t > began), default=0.0)
