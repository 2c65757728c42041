"""Fixtures for the engine's unit tests: two servers on one in-memory store and a clock the test moves
(tests/conftest.py loads them for every test; a module's own fixture of the same name wins), the
job those tests push, a store's next commit held on its way (`gated`), and the turns of the loop that
let a change reach it (`every_task_ran`)."""

from __future__ import annotations

import asyncio
import random

import pytest

from seamq.jobs.engine import Engine
from seamq.jobs.memory_store import Clock, MemoryJobStore


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    return MemoryJobStore(clock)


@pytest.fixture
async def servers(store, clock):
    """Two servers on one store."""
    made = [await Engine(store, clock=clock, rng=random.Random(n)).start(clocks=False) for n in (1, 2)]
    yield made
    for engine in made:
        await engine.stop()


@pytest.fixture
def engine(servers):
    return servers[0]


def job(job_type: str = "t.run", queue: str = "q", **options) -> dict:
    return {"type": job_type, "args": [], "options": {"queue": queue, **options}}


async def push(engine: Engine, body: dict) -> dict:
    return (await engine.ops.push(body))[1]


async def every_task_ran() -> None:
    """Turns of the loop, not time: for tests where nothing waits on I/O."""
    for _ in range(50):
        await asyncio.sleep(0)


def gated(store) -> asyncio.Event:
    """The store's next commit waits until the returned event is set (a batch on its way to NATS)."""
    gate, commit = asyncio.Event(), store.commit

    async def held(writes):
        store.commit = commit
        await gate.wait()
        return await commit(writes)
    store.commit = held
    return gate
