"""The one retry-delay policy (seamq.backoff): each growth, its cap, its spread, and a loop's waits."""

from __future__ import annotations

import random

import pytest

from seamq.backoff import EQUAL_JITTER, NO_JITTER, Away, Backoff, Growth


@pytest.mark.parametrize(("growth", "fulls"), [
    (Growth.EXPONENTIAL, [1, 3, 9, 27, 81]),
    (Growth.POLYNOMIAL, [1, 8, 27, 64, 100]),  # n^3: 125 at n = 5, capped
    (Growth.LINEAR, [1, 2, 3, 4, 5]),
    (Growth.CONSTANT, [1, 1, 1, 1, 1]),
])
def test_each_growth_grows_as_named_and_stops_at_its_cap(growth, fulls):
    policy = Backoff(base=1.0, cap=100.0, factor=3.0, growth=growth, spread=NO_JITTER)
    assert [policy.full(n) for n in range(1, 6)] == fulls
    assert [policy.delay(n) for n in range(1, 6)] == fulls, "no jitter: the delay is the full delay"


def test_attempt_zero_or_below_counts_as_the_first():
    policy = Backoff(base=2.0, spread=NO_JITTER)
    assert policy.full(0) == policy.full(-3) == policy.full(1) == 2.0


@pytest.mark.parametrize("growth", list(Growth))
def test_an_attempt_far_past_any_float_ends_at_the_cap(growth):
    policy = Backoff(base=1.0, cap=30.0, factor=2.0, growth=growth)
    huge = 10**400  # past a float: 2.0 ** huge and float(huge) both overflow
    assert policy.full(huge) == (1.0 if growth is Growth.CONSTANT else 30.0)


def test_equal_jitter_draws_between_half_and_all_of_the_delay():
    policy = Backoff(base=1.0, cap=60.0)
    assert policy.spread == EQUAL_JITTER
    rng = random.Random(3)
    for n in range(1, 12):
        low, high = policy.bounds(n)
        full = min(60.0, 2.0 ** (n - 1))
        assert (low, high) == (full / 2, full)
        draws = [policy.delay(n, rng) for _ in range(200)]
        assert all(low <= d <= high for d in draws)
        assert max(draws) - min(draws) > (high - low) / 2, "spread across the range, not one value"


def test_a_spread_above_one_never_passes_the_cap():
    policy = Backoff(base=10.0, cap=12.0, growth=Growth.CONSTANT, spread=(0.5, 1.5))
    assert policy.bounds(1) == (5.0, 12.0)
    rng = random.Random(1)
    assert all(policy.delay(1, rng) <= 12.0 for _ in range(500))


@pytest.mark.parametrize("bad", [dict(base=-1.0), dict(cap=-1.0), dict(factor=-0.5), dict(spread=(1.0, 0.5)),
                                 dict(spread=(-0.1, 1.0))])
def test_a_policy_that_cannot_be_is_refused(bad):
    with pytest.raises(ValueError, match="not a backoff"):
        Backoff(**bad)


def test_a_loop_waits_longer_each_failure_in_a_row_and_from_the_start_once_it_is_back():
    away = Away(Backoff(base=0.1, cap=5.0, spread=NO_JITTER))
    assert [away.next() for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert away.waited == 5.0
    away.back()
    assert away.waited == 0.0
    assert away.next() == 0.1
    assert away.next(most=0.15) == 0.15, "a caller's own bound (a deadline) wins"
