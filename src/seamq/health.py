"""What a worker's /healthz and /readyz answer, from what its loops report.

Alive means every loop is turning: a loop that has started a piece of work
(a claim, a fetch, a lane's transaction) finishes it within `stale_after`
seconds. Waiting on a timer is resting, not hanging: timers always end, and
only I/O can hang. A process that is not alive should be restarted; nothing
else will unstick it.

Ready means alive, started and not stopping, and every dependency check
(NATS connected, PostgreSQL answering, the provisioned streams and consumers
present) passing now. Checks are coroutines the wiring registers; they run
when a probe asks, so the answer is never older than the probe. This module
does no I/O itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from seamq.model import describe

Check = Callable[[], Awaitable[None]]  # returns when healthy, raises with the reason otherwise


class Beat:
    """One loop's pulse. `turn()` when it starts work, `rest()` before it waits on a timer or a queue."""

    __slots__ = ("deadline", "_stale_after")

    def __init__(self, stale_after: float) -> None:
        self._stale_after = stale_after
        self.deadline: float | None = None  # None: resting

    def turn(self) -> None:
        self.deadline = time.monotonic() + self._stale_after

    def rest(self) -> None:
        self.deadline = None

    def __enter__(self) -> "Beat":
        self.turn()
        return self

    def __exit__(self, *_: object) -> None:
        self.rest()


@dataclass(frozen=True)
class Answer:
    ok: bool
    checks: dict[str, str]  # name -> "ok" or the reason it failed

    def body(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "failing", "checks": self.checks}


class Health:
    def __init__(self, stale_after: float = 60.0, check_timeout: float = 2.0) -> None:
        self.stale_after = stale_after
        self.check_timeout = check_timeout
        self._beats: dict[str, Beat] = {}
        self._checks: dict[str, Check] = {}
        self.started = False  # the worker's loops run
        self.stop: asyncio.Event | None = None  # set: the worker is finishing what it has, then exits

    def beat(self, name: str) -> Beat:
        return self._beats.setdefault(name, Beat(self.stale_after))

    def check(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def live(self, now: float | None = None) -> Answer:
        now = time.monotonic() if now is None else now
        stuck = {name: f"busy for more than {self.stale_after:g}s" for name, beat in self._beats.items()
                 if beat.deadline is not None and now > beat.deadline}
        return Answer(not stuck, stuck or {"loops": "ok"})

    async def ready(self) -> Answer:
        live = self.live()
        stopping = self.stop is not None and self.stop.is_set()
        state = {"worker": "stopping" if stopping else "ok" if self.started else "starting"}
        names = list(self._checks)
        results = await asyncio.gather(*(self._run(self._checks[n]) for n in names))
        checks = {**state, **dict(zip(names, results)), **({} if live.ok else live.checks)}
        return Answer(live.ok and all(v == "ok" for v in checks.values()), checks)

    async def _run(self, check: Check) -> str:
        try:
            await asyncio.wait_for(check(), self.check_timeout)
            return "ok"
        except asyncio.TimeoutError:
            return f"no answer within {self.check_timeout:g}s"
        except Exception as exc:
            return describe(exc, 300)
