"""One test per rule of the consumer's decision (seamq.verdict), without NATS or PostgreSQL."""

from __future__ import annotations

import random

import pytest

from seamq.envelope import HandlerResult, Outcome, Reason, Rejected
from seamq.backoff import Backoff
from seamq.verdict import Ack, DeadLetter, Duplicate, Nak, copy_of, dead_letter_failed, decide, lane_failed

BACKOFF = Backoff(base=1.0, cap=60.0)
OK = HandlerResult(Outcome.OK)


def verdict(**known):
    args = dict(duplicate=False, rejected=None, after=None, result=OK, attempt=1, max_deliver=5, backoff=BACKOFF,
                rng=random.Random(7))
    return decide(**{**args, **known})


def test_a_message_the_inbox_has_done_is_a_duplicate_whatever_else_is_true():
    """POL-047-005: processed or dead-lettered already -> ACK without calling the handler."""
    assert verdict(duplicate=True, rejected=Rejected(Reason.INVALID_JSON, "x", None), after=3.0,
                   result=HandlerResult(Outcome.RETRY, "down"), attempt=9) == Duplicate()


def test_a_message_that_can_never_be_parsed_is_dead_lettered_at_once_with_its_reason():
    assert verdict(rejected=Rejected(Reason.NO_HANDLER, "no handler for a.v1", None), attempt=1) == \
        DeadLetter(Reason.NO_HANDLER, "no handler for a.v1")


def test_a_message_held_behind_its_aggregate_waits_for_the_hold_and_records_no_error():
    assert verdict(after=2.5, result=None) == Nak(2.5)


def test_a_message_sent_back_never_comes_back_before_its_aggregates_earlier_ones():
    """The stretch behind an earlier message of its aggregate is part of the decision, not applied after it."""
    assert verdict(result=HandlerResult(Outcome.RETRY, "503"), attempt=1, after=30.0) == Nak(30.0, "503")
    short = verdict(result=HandlerResult(Outcome.RETRY, "503"), attempt=1, after=0.01)
    assert 0.5 <= short.delay <= 1.0, "its own backoff when that is the later one"
    assert lane_failed(error="boom", alone=False, attempt=1, max_deliver=5, database_away=False, backoff=BACKOFF,
                       after=20.0) == Nak(20.0, "boom")
    got = dead_letter_failed(DeadLetter(Reason.INVALID_JSON, "x"), "no responders", attempt=1, backoff=BACKOFF,
                             after=9.0)
    assert got.delay == 9.0


def test_a_second_copy_in_a_lane_is_settled_as_its_first_and_never_run():
    assert copy_of(Ack(), after=None) == Duplicate()
    assert copy_of(Duplicate(), after=None) == Duplicate()
    assert copy_of(DeadLetter(Reason.MAX_DELIVER, "x"), after=None) == DeadLetter(Reason.MAX_DELIVER, "x")
    assert copy_of(Nak(2.0, "503"), after=2.05) == Nak(2.05, "503"), "back just after its first"


def test_handled_is_ack_and_already_processed_409_is_ack_too():
    assert verdict() == Ack()
    assert verdict(result=HandlerResult(Outcome.ALREADY_PROCESSED)) == Ack()


def test_poison_422_is_dead_lettered_with_the_handlers_reason_or_handler_rejected():
    assert verdict(result=HandlerResult(Outcome.POISON, "negative total")) == \
        DeadLetter(Reason.HANDLER_REJECTED, "negative total")
    assert verdict(result=HandlerResult(Outcome.POISON, "bad", Reason.SCHEMA_MISMATCH)) == \
        DeadLetter(Reason.SCHEMA_MISMATCH, "bad")
    assert verdict(result=HandlerResult(Outcome.POISON)) == DeadLetter(Reason.HANDLER_REJECTED, "handler rejected it")


def test_a_retry_before_max_deliver_is_a_nak_with_backoff_and_the_error():
    got = verdict(result=HandlerResult(Outcome.RETRY, "503 from handler"), attempt=3)
    assert isinstance(got, Nak) and got.error == "503 from handler"
    assert 2.0 <= got.delay <= 4.0  # base * 2^(3-1) = 4, equal jitter: [2, 4]


def test_a_retry_on_the_last_attempt_is_dead_lettered():
    """POL-047-007: max_deliver counts the handler's attempts (holds and crashes are none)."""
    assert verdict(result=HandlerResult(Outcome.RETRY, "timeout"), attempt=5) == \
        DeadLetter(Reason.MAX_DELIVER, "5 attempts; last: timeout")


def test_a_message_the_service_is_running_in_another_call_comes_back_and_is_no_attempt():
    """423 (seamq.http.handled): the first call still runs it; a dead letter now would send a message
    that is being handled to the DLQ, so even past max_deliver it only comes back."""
    got = verdict(result=HandlerResult(Outcome.BUSY, "HTTP 423"), attempt=5)
    assert isinstance(got, Nak) and got.error is None and 8.0 <= got.delay <= 16.0
    assert isinstance(verdict(result=HandlerResult(Outcome.BUSY), attempt=1, after=30.0), Nak)


def test_a_message_that_may_run_needs_a_result():
    with pytest.raises(ValueError):
        verdict(result=None)


def test_backoff_is_exponential_capped_with_equal_jitter():
    rng = random.Random(1)
    for attempt, full in [(1, 1.0), (2, 2.0), (4, 8.0), (7, 60.0), (30, 60.0)]:
        delay = BACKOFF.delay(attempt, rng)
        assert full / 2 <= delay <= full


def test_a_failed_lane_sends_everything_back_except_a_lone_message_on_its_last_attempt():
    back = lane_failed(error="boom", alone=False, attempt=5, max_deliver=5, database_away=False, backoff=BACKOFF)
    assert isinstance(back, Nak) and back.error == "boom"
    assert lane_failed(error="boom", alone=True, attempt=5, max_deliver=5, database_away=False,
                       backoff=BACKOFF) == DeadLetter(Reason.CONSUMER_ERROR,
                                                      "its transaction failed on all 5 attempts: boom")
    away = lane_failed(error="down", alone=True, attempt=5, max_deliver=5, database_away=True, backoff=BACKOFF)
    assert isinstance(away, Nak), "the database being away is nobody's fault: never a dead letter"


def test_a_dead_letter_that_cannot_be_published_is_not_acked():
    got = dead_letter_failed(DeadLetter(Reason.INVALID_JSON, "x"), "no responders", attempt=2, backoff=BACKOFF)
    assert isinstance(got, Nak) and got.error == "DLQ publish failed (no responders); was: invalid_json"
