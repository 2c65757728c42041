"""The engine's in-process mirror without a server: queue order, stale entries, counts, rate limits."""

from __future__ import annotations

from seamq.jobs.index import Index, TokenBucket


def job(job_id: str, state: str = "available", priority: int = 0, queue: str = "q", **extra) -> dict:
    return {"id": job_id, "queue": queue, "state": state, "priority": priority, **extra}


def test_priority_then_fifo_and_stale_entries_are_skipped():
    index = Index()
    index.put(job("low", priority=-10), 1)
    index.put(job("first"), 2)
    index.put(job("high", priority=10), 3)
    index.put(job("second"), 4)
    index.put(job("first", state="active"), 5)  # claimed elsewhere since: its heap entry is stale
    order = [index.next_available("q") for _ in range(4)]
    assert [held[0]["id"] if held else None for held in order] == ["high", "second", "low", None]


def test_a_late_older_revision_changes_nothing_and_counts_follow_states():
    index = Index()
    index.put(job("a"), 1)
    index.put(job("a", state="active"), 2)
    index.put(job("a"), 1)  # a reload that lost the race
    assert index.get("a")[0]["state"] == "active"
    index.put(job("b"), 3)
    assert index.stats("q")["available"] == 1 and index.stats("q")["active"] == 1
    index.drop("b")
    assert index.stats("q")["available"] == 0


def test_token_bucket_starts_full_and_refills_at_its_rate():
    bucket = TokenBucket(1.0)
    assert bucket.take(3) == 1 and bucket.take(1) == 0
    bucket.at -= 1.0  # a second later
    assert bucket.take(5) == 1
    assert TokenBucket(50).take(100) == 50


def test_rate_limit_comes_from_a_job_of_the_queue():
    index = Index()
    index.put(job("a", options={"rate_limit": {"max_per_second": 2}}), 1)
    assert index.limits["q"].rate == 2.0
