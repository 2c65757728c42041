"""The one retry-delay policy: how long anything in seamq waits before it tries again.

The consumer's NAKs (seamq.verdict), the outbox rows the relay could not publish (seamq.relay), the
automatic replays of dead letters (seamq.dlq_replay), the jobs' retries (OJS `retry` options), and
the waits of loops and clients while something they need is away all take their delay from a
`Backoff`. Where their formulas differ, the difference is a named parameter (as Oban's `Backoff`
has modes): how the delay grows with the attempt, its cap, and the spread its jitter draws from.
The delay is always computed here, in Python, and passed to SQL where a row keeps it, so a test of
this module checks what runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Growth(StrEnum):
    """How the delay grows with the attempt number n (1 on the first failure)."""

    EXPONENTIAL = "exponential"  # base * factor^(n - 1)
    POLYNOMIAL = "polynomial"  # base * n^factor
    LINEAR = "linear"  # base * n
    CONSTANT = "constant"  # base


EQUAL_JITTER = (0.5, 1.0)  # between half and all of the delay: failures at once do not come back at once
NO_JITTER = (1.0, 1.0)


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    growth: Growth = Growth.EXPONENTIAL
    spread: tuple[float, float] = EQUAL_JITTER  # the delay times a factor drawn from [low, high], capped

    def __post_init__(self) -> None:
        low, high = self.spread
        if not (self.base >= 0 and self.cap >= 0 and self.factor >= 0 and 0 <= low <= high):
            raise ValueError(f"not a backoff: {self!r}")

    def full(self, attempt: int) -> float:
        """The delay after failed attempt `attempt` before jitter: grown, then capped."""
        n = max(1, attempt)
        try:
            if self.growth is Growth.EXPONENTIAL:
                grown = self.base * self.factor ** (n - 1)
            elif self.growth is Growth.POLYNOMIAL:
                grown = self.base * float(n) ** self.factor
            elif self.growth is Growth.LINEAR:
                grown = self.base * n
            else:
                grown = self.base
        except OverflowError:  # a float power past 1e308: far past any cap
            grown = self.cap
        return min(self.cap, grown)

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The shortest and longest delay `delay(attempt)` can draw."""
        full = self.full(attempt)
        return min(self.cap, full * self.spread[0]), min(self.cap, full * self.spread[1])

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1 on the first)."""
        low, high = self.bounds(attempt)
        return low if low == high else (rng or random).uniform(low, high)


@dataclass
class Away:
    """A loop's waits while something it needs is away: by its policy, from the failures in a row."""

    policy: Backoff
    failures: int = 0
    waited: float = 0.0  # the last wait, so a loop can say when its wait changes

    def next(self, most: float | None = None) -> float:
        """One more failure: the seconds to wait now (at most `most`)."""
        self.failures += 1
        wait = self.policy.delay(self.failures)
        self.waited = wait if most is None else min(most, wait)
        return self.waited

    def back(self) -> None:
        """It answered: the next failure waits the first delay again."""
        self.failures, self.waited = 0, 0.0
