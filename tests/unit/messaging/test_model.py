import uuid
from datetime import datetime, timedelta, timezone

import pytest

from seamq.model import ErrorCode, Event, EventSubject, SeamqError, check_outbox_policies, message_headers


def event(**overrides):
    fields = dict(context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed",
                  payload={"total": 3})
    fields.update(overrides)
    return Event(**fields)


def test_subject_convention():
    assert str(event(event_version=2).subject) == "sea.event.order_placed.v2"
    assert EventSubject.parse("vibespro.event.vibe_created.v1") == EventSubject("vibespro", "vibe_created", 1)


@pytest.mark.parametrize("subject", [
    "sea.event.order_placed", "sea.event.Order.v1", "sea.event.a.b.v1", "sea.event.*.v1", "sea.event.>.v1",
    "sea.event.order placed.v1", "sea.evt.x.v1", "sea.event.x.v0", "",
])
def test_bad_subjects(subject):
    with pytest.raises(SeamqError) as err:
        EventSubject.parse(subject)
    assert err.value.code == ErrorCode.INVALID_SUBJECT


@pytest.mark.parametrize("overrides,code", [
    (dict(event_type=""), ErrorCode.INVALID_OUTBOX),
    (dict(event_type="Order.Placed"), ErrorCode.INVALID_OUTBOX),
    (dict(event_type="order_*"), ErrorCode.INVALID_OUTBOX),
    (dict(context="SEA"), ErrorCode.INVALID_OUTBOX),
    (dict(id=None), ErrorCode.INVALID_OUTBOX),
    (dict(aggregate_id=""), ErrorCode.INVALID_OUTBOX),
    (dict(payload=[1, 2]), ErrorCode.INVALID_OUTBOX),
    (dict(event_version=0), ErrorCode.INVALID_OUTBOX),
    (dict(correlation_id="not-a-uuid"), ErrorCode.INVALID_OUTBOX),
    (dict(occurred_at=datetime(2020, 1, 1)), ErrorCode.INVALID_OUTBOX),  # naive
    # A day ahead: the value is taken when tests are collected, and the suite runs longer than minutes.
    (dict(occurred_at=datetime.now(timezone.utc) + timedelta(days=1)), ErrorCode.FUTURE_EVENT),
])
def test_outbox_policies_carry_codes(overrides, code):
    with pytest.raises(SeamqError) as err:
        check_outbox_policies(event(**overrides))
    assert err.value.code == code


def test_small_clock_skew_is_allowed():
    check_outbox_policies(event(occurred_at=datetime.now(timezone.utc) + timedelta(seconds=30)))


def test_headers():
    e = event(correlation_id=uuid.uuid4())
    headers = message_headers(e, "00-abc-def-01")
    assert headers["Nats-Msg-Id"] == str(e.id)
    assert headers["Seamq-Correlation-Id"] == str(e.correlation_id)
    assert "Seamq-Causation-Id" not in headers and headers["traceparent"] == "00-abc-def-01"


def test_an_error_is_described_once_the_same_way_and_never_longer_than_the_limit():
    from seamq.model import ERROR_LIMIT, describe

    assert describe(ValueError("bad total")) == "ValueError: bad total"
    assert describe(TimeoutError()) == "TimeoutError"  # no dangling ": " for an exception without text
    assert len(describe(RuntimeError("x" * 100_000))) == ERROR_LIMIT
    assert describe(RuntimeError("abcdef"), 10) == "RuntimeErr"


# ---- the HTTP request body: the payload sent as its producer encoded it ----------------------------

def _envelope(data: bytes):
    from seamq.envelope import parse_message

    event = Event(context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed", payload={})
    return parse_message(str(event.subject), message_headers(event), data)


@pytest.mark.parametrize("data", [
    b'{"a": 1, "b": [true, null, "\\u00e9"], "c": {"d": 1.5e3}}',  # escapes and spacing kept as they came
    '{"name": "Zoë 🎉", "n": -0}'.encode(),  # plain UTF-8
])
def test_the_body_splices_the_payload_as_it_came_and_means_the_same(data):
    import json

    envelope = _envelope(data)
    assert envelope.payload_json == data
    body = envelope.body()
    assert data in body  # not encoded a second time
    assert json.loads(body) == json.loads(json.dumps(envelope.to_json()))  # the same document as before


@pytest.mark.parametrize("data", [
    '{"name": "Zoë"}'.encode("utf-16"),  # json.loads takes UTF-16 and 32: not sendable as they are
    '{"name": "Zoë"}'.encode("utf-32-le"),
    b'\xef\xbb\xbf{"a": 1}',  # a BOM
    b'{"a": "\xed\xa0\x80"}',  # a surrogate in UTF-8 (json.loads decodes with surrogatepass)
])
def test_a_payload_that_is_not_plain_utf8_is_encoded_again(data):
    import json

    from seamq.envelope import Envelope

    envelope = _envelope(data)
    assert isinstance(envelope, Envelope), envelope  # taken, as before
    assert envelope.payload_json is None
    body = envelope.body()
    body.decode()  # strict UTF-8 on the wire
    assert json.loads(body)["payload"] == envelope.payload


def test_a_dead_letters_stored_state_is_read_typed_and_a_wrong_value_is_left_out():
    from datetime import datetime, timezone

    from seamq.dead_letter import State

    state = State.of({"reason": "max_deliver", "dlq_seq": "42", "replay_attempts": 2, "purged_at": None,
                      "dead_lettered_at": "2026-11-26T15:00:00.123456+00:00", "next_replay_at": "not a time",
                      "edited_as": "b7f0", "somebody_elses": 1})
    assert state.reason == "max_deliver" and state.dlq_seq == 42 and state.replay_attempts == 2
    assert state.dead_lettered_at == datetime(2026, 11, 26, 15, 0, 0, 123456, tzinfo=timezone.utc)
    assert state.next_replay_at is None and state.closed and state.edited_as == "b7f0"
    assert State.of(None) == State() and not State().closed and State().replay_attempts == 0


@pytest.mark.parametrize("data", [
    b'{"n": NaN, "i": Infinity, "big": 1e400}', b'{"n": 123456789012345678901234567890}',
    b'{"n": -9223372036854775809, "m": 18446744073709551615}', b'{"s": "\\ud800", "d": {"a": 1, "a": 2}}',
    b'{"f": [1.0000000000000000001, -0.0, 5e-324, 1.7976931348623157e308]}', b'{"deep": ' + b'[' * 500 + b']' * 500 + b'}',
])
def test_a_payload_reads_exactly_as_the_standard_library_reads_it(data):
    """orjson reads most payloads; where it would read one otherwise (a float for a long integer) or
    not at all (NaN), the standard library does: a producer's payload is not ours to change or refuse."""
    import json

    payload = _envelope(data).payload
    expected = json.loads(data)
    assert repr(payload) == repr(expected)  # types too: 1 is not 1.0, NaN is NaN
    assert [type(v) for v in payload.values()] == [type(v) for v in expected.values()]


def test_new_events_get_time_ordered_ids():
    """Issue 45: UUIDv7, so the outbox's indexes append and an id tells its time."""
    import time

    from seamq.model import Event

    before = int(time.time() * 1000)
    made = [Event(context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed", payload={}).id
            for _ in range(2000)]
    assert all(i.version == 7 for i in made) and made == sorted(made) and len(set(made)) == len(made)
    assert before <= made[0].int >> 80 <= int(time.time() * 1000)  # its first 48 bits: when it was made
