"""Per-key rate limits decided without I/O (seamq.jobs.limits): the policy a job names, and what its
key's partition says of each start."""

from __future__ import annotations

import random
import statistics

import pytest

from seamq.jobs import limits
from seamq.jobs.limits import Policy, Window


def policy(**fields) -> Policy:
    found = limits.policy_of({"key": "api", **fields})
    assert found is not None
    return found


def started(p: Policy, partition: dict | None, job_id: str, now: int, attempt: int = 1) -> dict:
    verdict = limits.admit(p, partition, job_id, attempt, now)
    assert verdict.wait_ms == 0, verdict
    return verdict.partition


def test_both_forms_of_a_window_are_read_and_anything_else_is_refused_with_its_reason():
    assert policy(rate={"limit": 100, "period": "PT1M"}).rate == Window(100, 60.0)
    assert policy(rate=1, period="second").rate == Window(1, 1.0)  # the suite's form
    assert policy(throttle={"limit": 10, "period": "PT1S"}).throttle == Window(10, 1.0)
    assert policy(concurrency=0).concurrency == 0 and policy(concurrency=0).on_limit == "wait"
    assert limits.problem(None) is None and limits.problem({"max_per_second": 5}) is None  # the queue's rate
    for bad, why in [("x", "must be an object"), ({}, "needs a key"), ({"key": "a b", "concurrency": 1}, "key must match"),
                     ({"key": "a", "concurrency": -1}, "concurrency"), ({"key": "a", "concurrency": True}, "concurrency"),
                     ({"key": "a"}, "names no limit"), ({"key": "a", "rate": {"limit": 0, "period": "PT1S"}}, "rate.limit"),
                     ({"key": "a", "rate": {"limit": 5, "period": "soon"}}, "rate.period"),
                     ({"key": "a", "throttle": 5}, "throttle must be an object"),
                     ({"key": "a", "concurrency": 1, "on_limit": "panic"}, "on_limit")]:
        assert why in (limits.problem(bad) or ""), (bad, limits.problem(bad))


def test_a_concurrency_limit_counts_permits_and_a_job_given_back_frees_its_own():
    p = policy(concurrency=2)
    held = started(p, started(p, None, "j1", 1000), "j2", 1001)
    full = limits.admit(p, held, "j3", 1, 1002)
    assert (full.wait_ms > 0, full.strategy, full.limit, full.current) == (True, "concurrency", 2, 2)
    assert limits.admit(p, held, "j1", 2, 1003).wait_ms == 0  # its own permit, claimed again after a lost lease
    assert limits.released(held, "j1", 0) is None  # an earlier attempt's end does not give back a later one's permit
    assert set(started(p, limits.released(held, "j1", 1), "j3", 1004)["active"]) == {"j2", "j3"}
    assert limits.admit(policy(concurrency=0), None, "j1", 1, 1000).wait_ms > 0  # 0 holds every job of the key


def test_permits_whose_jobs_do_not_hold_them_are_stale_by_their_records():
    p = policy(concurrency=6)
    held = None
    for job_id in ("running", "ended", "gone", "later", "coming", "lost"):
        held = started(p, held, job_id, 100_000 - (limits.GRACE_MS + 1 if job_id == "lost" else 0))
    records = {"running": {"attempt": 1, "state": "active"}, "ended": {"attempt": 1, "state": "completed"},
               "later": {"attempt": 2, "state": "active"}, "coming": {"attempt": 0, "state": "available"},
               "lost": {"attempt": 0, "state": "available"}}
    assert sorted(limits.stale(held, records, 100_000)) == ["ended", "gone", "later", "lost"]


def test_a_sliding_window_lets_at_most_its_limit_start_in_any_period_and_says_when_the_next_may():
    p = policy(rate={"limit": 3, "period": "PT1S"})
    held = None
    for now in (0, 100, 900):
        held = started(p, held, f"j{now}", now)
    wait = limits.admit(p, held, "x", 1, 950)
    assert (wait.wait_ms, wait.strategy, wait.current) == (50, "rate", 3)  # the start at 0 leaves the window at 1000
    held = started(p, held, "j1000", 1000)
    assert limits.admit(p, held, "x", 1, 1050).wait_ms == 50  # 100 leaves at 1100
    assert len(held["starts"]) == 3  # no more than the limit kept



def test_a_start_decided_on_a_clock_read_a_moment_earlier_counts_from_the_latest_start():
    """Found by the three-server test: a server whose clock read later trimmed two starts from the
    window, and one whose clock read earlier then counted without them (4 starts in one second)."""
    p = policy(rate={"limit": 3, "period": "PT1S"})
    later = limits.admit(p, {"key": "api", "starts": [100, 110, 900]}, "a", 1, 1120)
    assert later.wait_ms == 0 and later.partition["starts"] == [900, 1120]
    earlier = limits.admit(p, later.partition, "b", 1, 1050)
    assert earlier.wait_ms == 0 and earlier.at_ms == 1120  # counted (and started) no earlier than the latest
    starts = [100, 110, *earlier.partition["starts"]]
    assert max(sum(1 for s in starts if t <= s < t + 1000) for t in starts) <= 3


def test_windows_past_the_sliding_log_count_in_fixed_windows_aligned_on_the_period():
    p = policy(rate={"limit": limits.SLIDING_MOST + 1, "period": "PT1M"})
    held = None
    for n in range(limits.SLIDING_MOST + 1):
        held = started(p, held, f"j{n}", 60_000 + n)
    assert limits.admit(p, held, "x", 1, 90_000).wait_ms == 30_000  # until the next minute
    assert limits.admit(p, held, "x", 1, 120_000).wait_ms == 0
    assert not held["starts"]


def test_a_throttle_spaces_starts_evenly():
    p = policy(throttle={"limit": 4, "period": "PT1S"})
    held = started(p, None, "a", 1000)
    assert limits.admit(p, held, "b", 1, 1100).wait_ms == 150
    assert started(p, held, "b", 1250)["next_ms"] == 1500


def test_a_crowd_on_a_window_comes_back_about_as_often_as_the_key_lets_jobs_start():
    """1,000 jobs held back on a key of 20 a second come back spread over the 50 s they need to start,
    about 40 looks a second, not ~200 (the 5 s cap for each): a crowd looked at faster than the servers
    can look holds up every other job of its queue. A few, and a full concurrency key, as before."""
    rng = random.Random(7)
    p = policy(rate={"limit": 20, "period": "PT1S"})
    full = {"starts": list(range(1000, 1020))}
    verdict = limits.admit(p, full, "late", 1, 1020)
    assert verdict.wait_ms > 0 and verdict.per_second == 20.0
    crowded = [verdict._replace(crowd=1000).held_for(8, rng) for _ in range(2000)]
    assert max(crowded) <= limits.LOOK_MOST_MS / 1000 + 50 and min(crowded) >= limits.LOOK_MOST_MS / 1000
    assert 15 <= 1000 / statistics.mean(crowded) <= 60, statistics.mean(crowded)
    few = [verdict._replace(crowd=5).held_for(1, rng) for _ in range(200)]
    first = max(verdict.wait_ms, limits.CONCURRENCY_WAIT_MS)  # a first look: the key's wait, spread by as much
    assert max(few) <= (first + min(first, limits.SPREAD_MS)) / 1000
    busy = limits.admit(policy(concurrency=1), {"active": {"other": [1, 1000]}}, "late", 1, 1020)
    assert busy.strategy == "concurrency" and busy.per_second == 0
    assert max(busy._replace(crowd=1000).held_for(8, rng) for _ in range(200)) <= limits.CONCURRENCY_WAIT_MOST_MS * 2 / 1000


def test_an_override_by_hand_wins_until_it_ends_and_a_handlers_pause_holds_the_key():
    p = policy(concurrency=5)
    paused = {"key": "api", "override": {"concurrency": 0, "until_ms": 5000}}
    assert limits.admit(p, paused, "a", 1, 4000).strategy == "concurrency"
    assert limits.admit(p, paused, "a", 1, 5000).wait_ms == 0
    assert limits.admit(p, {"key": "api", "paused_until_ms": 7000}, "a", 1, 6500).wait_ms == 500


def test_the_partition_shown_and_the_headers_of_an_enqueue():
    p = policy(concurrency=2, rate={"limit": 10, "period": "PT1M"})
    held = started(p, None, "a", 1000)
    shown = limits.public(held, 2000)
    assert shown["concurrency"] == {"limit": 2, "active": 1, "available": 1}
    assert shown["rate"]["current_count"] == 1 and shown["rate"]["remaining"] == 9
    assert shown["rate"]["window_resets_at_ms"] == 61_000
    assert limits.headers(p, held, 2000) == {"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9",
                                            "X-RateLimit-Reset": "61"}
    assert limits.headers(policy(concurrency=3), None, 2000)["X-RateLimit-Remaining"] == "3"


@pytest.mark.parametrize("key, record", [("api", "rl.api"), ("tenant:acme:api", "rl.tenant=acme=api")])
def test_a_keys_record_has_no_colon(key, record):
    assert limits.record_key(key) == record
