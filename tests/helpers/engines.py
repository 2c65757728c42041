"""Fixtures for the engine's unit tests: two servers on one in-memory store and a clock the test moves
(tests/conftest.py loads them for every test; a module's own fixture of the same name wins)."""

from __future__ import annotations

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
