"""The one retry-delay formula: exponential in the attempt number, capped, with equal jitter.

The consumer's NAK delays (seamq.verdict) and the outbox rows the relay could not publish
(seamq.relay, which passes each row's delay to the database) both wait by it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float = 1.0
    cap: float = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1 on the first): between half and all
        of min(cap, base * 2^(attempt - 1)), so many failing at once do not come back at once."""
        full = min(self.cap, self.base * 2.0 ** (max(1, attempt) - 1))
        return full / 2 + (rng.uniform(0, full / 2) if rng else random.uniform(0, full / 2))
