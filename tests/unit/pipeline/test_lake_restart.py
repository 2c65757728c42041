"""`seamq pipeline lake` starts a failed query again from its checkpoint (seamq.pipeline.lake.keep_following):
on fakes of a streaming query, so the rule is checked without a JVM."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from seamq.model import ErrorCode, SeamqError  # noqa: E402
from seamq.pipeline.lake import keep_following  # noqa: E402


class Query:
    """A streaming query that has ended: after `batches` committed, failed with `error` (or not)."""

    def __init__(self, batches: list[int], error: str | None) -> None:
        self.isActive, self.error = False, error
        self.recentProgress = [{"batchId": b, "numInputRows": 10} for b in batches]

    def exception(self):
        return self.error

    def stop(self) -> None:
        pass


def run(queries: list[Query], restarts: int = 3) -> tuple[list[int], list[float]]:
    started, reported, pauses = iter(queries), [], []
    keep_following(lambda: next(started), lambda batch, rows: reported.append(batch), restarts=restarts,
                   pause=pauses.append)
    return reported, pauses


def test_a_query_that_fails_at_start_is_started_again_with_a_growing_pause():
    reported, pauses = run([Query([], "Python worker failed to connect back."),
                            Query([], "Python worker failed to connect back."), Query([0, 1], None)])
    assert reported == [0, 1] and pauses == [2.0, 4.0]


def test_failures_in_a_row_without_a_batch_end_it_with_the_last_reason():
    failing = [Query([], f"failure {n}") for n in range(1, 5)]
    with pytest.raises(SeamqError, match="failure 4") as ended:
        run(failing)
    assert ended.value.code is ErrorCode.PIPELINE_FAILED and "run it again" in str(ended.value)


def test_a_batch_committed_between_failures_starts_the_count_again():
    queries = [Query([], "a"), Query([], "b"), Query([0], "c"), Query([], "d"), Query([], "e"), Query([1], None)]
    reported, pauses = run(queries)
    assert reported == [0, 1] and pauses == [2.0, 4.0, 2.0, 4.0, 8.0]
