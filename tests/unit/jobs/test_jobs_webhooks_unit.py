"""seamq.jobs.webhooks: what a subscription matches, how a delivery is signed, what an answer means."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timezone

import pytest

from seamq.jobs import webhooks
from seamq.jobs.model import OjsError

NOW = datetime(2026, 12, 5, tzinfo=timezone.utc)


def sub(**given):
    record, _ = webhooks.created({"url": "https://example.com/h", "events": ["job.completed"], **given}, NOW)
    return record


def event(kind="job.completed", queue="q", job_type="t"):
    return {"id": "evt_1", "type": kind, "data": {"queue": queue, "job_type": job_type}}


def test_a_secret_is_made_when_none_is_given_and_never_shown():
    record, made = webhooks.created({"url": "https://example.com/h", "events": ["*"]}, NOW)
    assert made and made.startswith("whsec_") and record["_secret"] == made
    assert "secret" not in webhooks.public(record) and "_secret" not in webhooks.public(record)
    given, none = webhooks.created({"url": "https://example.com/h", "events": ["*"], "secret": "s" * 16}, NOW)
    assert none is None and given["_secret"] == "s" * 16


@pytest.mark.parametrize("events, kind, matched", [
    (["job.completed"], "job.completed", True), (["job.completed"], "job.discarded", False),
    (["job.*"], "job.discarded", True), (["job.*"], "workflow.started", False), (["*"], "cron.triggered", True)])
def test_events_by_type_and_wildcard(events, kind, matched):
    assert webhooks.matches(sub(events=events), event(kind)) is matched


def test_a_filter_and_an_inactive_subscription():
    filtered = sub(filter={"queues": ["payments"], "job_types": ["pay"]})
    assert webhooks.matches(filtered, event(queue="payments", job_type="pay"))
    assert not webhooks.matches(filtered, event(queue="other", job_type="pay"))
    assert not webhooks.matches(filtered, event(queue="payments", job_type="other"))
    assert not webhooks.matches(sub(active=False), event())


@pytest.mark.parametrize("body", [{"url": "ftp://x/y", "events": ["*"]}, {"url": "https://x", "events": []},
                                  {"url": "https://x", "events": ["Job Done"]}, {"url": "https://x", "events": ["*"], "secret": "short"},
                                  {"url": "https://x", "events": ["*"], "colour": "red"}, ["not", "an", "object"]])
def test_a_wrong_subscription_is_refused_with_its_reason(body):
    with pytest.raises(OjsError) as refused:
        webhooks.created(body, NOW)
    assert refused.value.status == 400 and refused.value.message


def test_the_signature_is_the_specs_hmac_of_timestamp_and_body():
    body = b'{"id":"evt_1"}'
    expected = hmac.new(b"k" * 16, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert webhooks.signature("k" * 16, 1700000000, body) == f"sha256={expected}"


def test_a_delivery_keeps_its_id_across_attempts_and_differs_per_subscription():
    assert webhooks.delivery_id("sub_a", "evt_1") == webhooks.delivery_id("sub_a", "evt_1")
    assert webhooks.delivery_id("sub_a", "evt_1") != webhooks.delivery_id("sub_b", "evt_1")


@pytest.mark.parametrize("status, verdict", [(200, "delivered"), (204, "delivered"), (None, "retry"), (429, "retry"),
                                             (503, "retry"), (400, "dead"), (404, "dead"), (410, "dead")])
def test_what_an_answer_means(status, verdict):
    assert webhooks.outcome(status) == verdict


def test_the_retry_schedule_is_the_specs_then_none():
    assert [webhooks.retry_in(n) for n in range(1, 9)] == [30, 120, 600, 3600, 14400, 43200, 86400, None]


def test_a_subscription_too_large_for_every_servers_memory_is_refused():
    with pytest.raises(OjsError) as refused:
        webhooks.created({"url": "https://x/h", "events": ["*"], "metadata": {"note": "x" * 20_000}}, NOW)
    assert "at most" in refused.value.message
