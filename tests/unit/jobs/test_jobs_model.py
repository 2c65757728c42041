"""The OJS job model without a server: validation, durations, ids, retry math, error types."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import datetime, timedelta, timezone

import pytest

from starlette.requests import Request

from seamq import codec
from seamq.jobs import attempts, model, unique
from seamq.jobs.api import body_of
from seamq.jobs.model import OjsError, RetryPolicy

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)
HYPHENATED = ["dlq.test.list-first", "retry.test.max-attempts", "worker.test.quiet-signal", "a-b", "x.y-z_1"]


def push(**body):
    body.setdefault("type", "email.send")
    body.setdefault("args", [])
    return model.new_record(body, NOW)


@pytest.mark.parametrize("body, status", [
    ({"args": []}, 400),  # no type
    ({"type": "email.send"}, 400),  # no args
    ({"type": "Email.Send", "args": []}, 400),
    ({"type": "email send", "args": []}, 400),
    ({"type": "1email.send", "args": []}, 400),
    ({"type": "", "args": []}, 400),
    ({"type": "email@send!", "args": []}, 400),
    ({"type": "email.send", "args": {"a": 1}}, 400),
    ({"type": "email.send", "args": "x"}, 400),
    ({"type": "email.send", "args": None}, 400),
    ({"type": "email.send", "args": [], "id": "550e8400-e29b-41d4-a716-446655440000"}, 400),  # v4
    ({"type": "email.send", "args": [], "id": "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"}, 400),  # uppercase
    ({"type": "email.send", "args": [], "id": ""}, 400),
    ({"type": "email.send", "args": [], "options": {"queue": "Default"}}, 400),
    ({"type": "email.send", "args": [], "options": {"queue": "my_queue!"}}, 400),
    ({"type": "email.send", "args": [], "options": {"queue": "-invalid"}}, 400),
    ({"type": "email.send", "args": [], "options": {"priority": 101}}, 400),
    ({"type": "email.send", "args": [], "options": {"priority": True}}, 400),
    ({"type": "email.send", "args": [], "options": {"retry": {"max_attempts": -1}}}, 422),
    ({"type": "email.send", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}}, 422),
    ({"type": "email.send", "args": [], "options": {"retry": {"initial_interval": "1 second"}}}, 422),
    ([1, 2], 400),
])
def test_bad_pushes_are_refused_with_the_right_status(body, status):
    with pytest.raises(OjsError) as refused:
        model.new_record(body, NOW)
    assert refused.value.status == status and refused.value.body()["error"]["retryable"] is False


@pytest.mark.parametrize("job_type", HYPHENATED)
def test_types_with_hyphens_are_accepted(job_type):
    assert push(type=job_type)["type"] == job_type


def test_options_are_flattened_and_extras_kept():
    record = push(args=[42, None, 3.14], x_custom={"a": 1}, meta={"trace_id": "t"},
                  options={"queue": "reports", "priority": 10, "delay_until": "2020-01-01T00:00:00Z",
                           "expires_at": "2099-12-31T23:59:59Z", "retry": {"max_attempts": 5}})
    assert (record["queue"], record["priority"], record["max_attempts"], record["state"]) == ("reports", 10, 5,
                                                                                              "available")
    assert record["args"] == [42, None, 3.14] and record["x_custom"] == {"a": 1}
    assert record["expires_at"] == "2099-12-31T23:59:59Z"  # echoed exactly
    assert model.UUIDV7_PATTERN.match(record["id"])
    scheduled = push(options={"scheduled_at": "+PT2S"})
    assert scheduled["state"] == "scheduled" and scheduled["scheduled_at"] == model.iso(NOW + timedelta(seconds=2))
    assert "enqueued_at" not in model.public(scheduled)


@pytest.mark.parametrize("text, seconds", [("PT1S", 1), ("PT2.5S", 2.5), ("PT5M", 300), ("PT1H", 3600),
                                           ("P1DT2H", 93600), ("P1D", 86400)])
def test_durations(text, seconds):
    assert model.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "P", "PT", "1S", "PT1", "PTS", "P1Y"])
def test_bad_durations(text):
    with pytest.raises(OjsError):
        model.parse_duration(text)


def test_uuid7_shape_and_order():
    ids = [model.uuid7(1_700_000_000_000 + n) for n in range(100)]
    assert all(model.UUIDV7_PATTERN.match(i) for i in ids) and ids == sorted(ids)
    made = [model.uuid7() for _ in range(10_000)]  # many within one millisecond: still in the order made
    assert made == sorted(made) and len(set(made)) == len(made) and all(model.UUIDV7_PATTERN.match(i) for i in made)


@pytest.mark.parametrize("retry, delays", [
    ({"initial_interval": "PT1S", "backoff_coefficient": 2.0, "jitter": False}, [1, 2, 4]),  # L1-RTR-001
    ({"initial_interval": "PT1S", "backoff_strategy": "linear", "jitter": False}, [1, 2, 3]),  # L1-RTR-009
    ({"initial_interval": "PT1S", "backoff_coefficient": 10, "max_interval": "PT2S", "jitter": False},
     [1, 2, 2]),  # L1-RTR-008
    ({"initial_interval": "PT1S", "backoff_coefficient": 1.0, "jitter": False}, [1, 1, 1]),  # L1-RTR-010
])
def test_backoff(retry, delays):
    policy = RetryPolicy.from_options(retry)
    assert [policy.delay(n) for n in (1, 2, 3)] == delays


def test_jitter_stays_within_half_and_one_and_a_half():
    policy = RetryPolicy.from_options({"initial_interval": "PT2S", "jitter": True})
    rng = random.Random(7)
    samples = [policy.delay(1, rng) for _ in range(10_000)]
    assert 1.0 <= min(samples) and max(samples) < 3.0 and max(samples) - min(samples) > 1.9


def test_non_retryable_errors_match_exactly_or_by_prefix():
    policy = RetryPolicy.from_options({"non_retryable_errors": ["FatalError", "Auth.*"]})
    assert policy.matches_non_retryable(["FatalError"]) and policy.matches_non_retryable(["Auth.TokenExpired"])
    assert not policy.matches_non_retryable(["Fatal"]) and not policy.matches_non_retryable(["Authx"])


@pytest.mark.parametrize("error, kind", [
    ({"code": "handler_error", "message": "Database connection timed out"}, "ConnectionTimeout"),
    ({"code": "handler_error", "message": "API rate limit reached"}, "RateLimitExceeded"),
    ({"code": "handler_error", "message": "Unexpected null reference"}, "InternalServerError"),
    ({"code": "x", "message": "m", "type": "Given"}, "Given"),
    ({"code": "x", "message": "m", "details": {"error_class": "SmtpError"}}, "SmtpError"),
])
def test_error_type_is_derived_when_not_given(error, kind):
    assert attempts.error_type(error) == kind


def test_fingerprint_ignores_key_order():
    a = push(args=[{"x": 1, "y": 2}], options={"unique": {"keys": ["type", "args"]}})
    b = push(args=[{"y": 2, "x": 1}], options={"unique": {"keys": ["type", "args"]}})
    assert unique.fingerprint(a) == unique.fingerprint(b)


@pytest.mark.parametrize("text", [b'{"args":[123456789012345678901234567890]}', b'{"args":[18446744073709551616]}',
                                  b'{"args":[-9223372036854775809]}',  # 19 digits, below a signed 64-bit
                                  b'{"args":["\\ud800"]}', b'\xef\xbb\xbf{"args":[1]}', '{"args":["é"]}'.encode("utf-16"),
                                  b'{"args":[1.5,-0,1e16,"\\u00e9",{"a":1,"a":2}]}'])
def test_codec_reads_what_the_standard_library_reads_and_gives_the_same_job_back(text):
    """orjson would read an integer beyond 64 bits as a float; the codec reads it exactly."""
    value = codec.loads(text)
    assert value == json.loads(text) and type(value["args"][0]) is type(json.loads(text)["args"][0])
    assert json.loads(codec.dumps(value)) == value


@pytest.mark.parametrize("text", [b'{"args":[NaN]}', b'{"args":[Infinity]}', b'{"args":[-Infinity]}',
                                  b'{"args":[1e400]}', b'{"args":[1e400, 12345678901234567890123]}', b'', b'{'])
def test_codec_refuses_what_is_not_json(text):
    with pytest.raises(ValueError):
        codec.loads(text)


def test_a_body_with_nan_is_refused_as_invalid_payload():
    """Before, it was taken and written back as `NaN`, which neither SDK's parser reads."""
    with pytest.raises(OjsError) as refused:
        asyncio.run(body_of(_request(b'{"type":"a.b","args":[NaN]}')))
    assert (refused.value.status, refused.value.code) == (400, "invalid_payload")
    assert "NaN is not JSON" in refused.value.message


def _request(body: bytes) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}
    return Request({"type": "http", "method": "POST", "headers": []}, receive)


@pytest.mark.parametrize("text, expected", [("2026-11-24T12:00:00.123Z", "2026-11-24T12:00:00.123Z"),
                                            ("2026-11-24t14:00:00.5+02:00", "2026-11-24T12:00:00.500Z"),
                                            ("2026-11-24T12:00:00z", "2026-11-24T12:00:00.000Z"),
                                            ("2026-11-24T12:00:00", "2026-11-24T12:00:00.000Z")])
def test_times_are_read_in_any_rfc_3339_form_and_written_in_utc_with_z(text, expected):
    assert model.iso(model.parse_time(text)) == expected


@pytest.mark.parametrize("text", ["yesterday", "", 12, None])
def test_a_time_that_is_not_one_is_refused(text):
    with pytest.raises(OjsError):
        model.parse_time(text)


def test_a_batch_and_its_queues_fit_one_atomic_batch():
    """NATS stores at most 1,000 records at once: a batch's jobs, and a count per queue they go to."""
    one_queue = {"jobs": [{"type": "t", "args": []} for _ in range(999)]}
    assert len(model.new_records(one_queue, NOW)) == 999
    with pytest.raises(OjsError, match="got 1000 jobs in 1 queue"):
        model.new_records({"jobs": [{"type": "t", "args": []} for _ in range(1000)]}, NOW)
    spread = {"jobs": [{"type": "t", "args": [], "options": {"queue": f"q{n % 2}"}} for n in range(999)]}
    with pytest.raises(OjsError, match="got 999 jobs in 2 queue"):
        model.new_records(spread, NOW)


def test_a_workflow_and_its_queues_fit_one_atomic_batch():
    from seamq.jobs import workflows

    def group(jobs):
        return {"type": "group", "jobs": jobs}
    fits = [{"type": "t", "args": []}] * (workflows.MAX_ITEMS - 1)
    assert len(workflows.new(group(fits), NOW)[1]) == workflows.MAX_ITEMS - 1
    with pytest.raises(OjsError, match="and their queues number at most"):
        workflows.new(group(fits + [{"type": "t", "args": [], "options": {"queue": "other"}}]), NOW)
    with pytest.raises(OjsError):  # a queue of the wrong shape is refused, not a crash
        workflows.new(group([{"type": "t", "args": [], "options": {"queue": ["x"]}}]), NOW)
