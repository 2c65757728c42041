"""A process whose work is an engine (`seamq jobs serve`, `seamq jobs worker --nats`) runs Python's
collector less often than Python would, and never again over what start-up made."""

from __future__ import annotations

import gc

from seamq.jobs.engine import collect_less


def test_an_engines_process_collects_less_often_and_freezes_what_start_up_made():
    before = gc.get_threshold()
    start_up = [object() for _ in range(10)]  # noqa: F841 (alive through the call, as start-up's objects are)
    try:
        collect_less()
        threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert threshold[0] >= 10_000 > before[0] and threshold[1:] == (10, 10)
    assert frozen > 0
