"""Hostile requests to every endpoint of `seamq jobs serve`: each answered with a 4xx and the OJS
error body, the server still up, and a job that was there before unchanged."""

from __future__ import annotations

import json

import aiohttp
import pytest

from helpers.jobs_harness import JobServer

HUGE = b'{"type":"a.b","args":["' + b"x" * (17 * 1024 * 1024) + b'"]}'
DEEP = b'{"type":"a.b","args":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
JOB = {"type": "test.bad", "args": [1], "options": {"queue": "bad"}}

BODIES = [b"", b"   ", b"not json", b"[1,2]", b"null", b'"text"', b"{", DEEP, b"\xff\xfe\x00garbage", HUGE]
POST_PATHS = ["/jobs", "/jobs/batch", "/workers/fetch", "/workers/ack", "/workers/nack", "/workers/heartbeat",
              "/workflows", "/cron"]
WRONG_FIELDS = [
    ("/jobs", {"type": 5, "args": []}),
    ("/jobs", {"type": "a.b", "args": "no"}),
    ("/jobs", {"type": "a.b", "args": [], "options": {"queue": "No Spaces*>"}}),
    ("/jobs", {"type": "a.b", "args": [], "options": {"priority": "high"}}),
    ("/jobs", {"type": "a.b", "args": [], "options": {"retry": {"max_attempts": -1}}}),
    ("/jobs", {"type": "a.b", "args": [], "options": {"scheduled_at": "yesterday"}}),
    ("/jobs", {"type": "a.b", "args": [], "id": "not-a-uuid"}),
    ("/jobs", {"type": "a.b", "args": ["x" * (600 * 1024)]}),
    ("/jobs/batch", {"jobs": "many"}),
    ("/jobs/batch", {"jobs": [JOB, {"type": 1}]}),
    ("/jobs/batch", {"jobs": [JOB] * 1001}),
    ("/workers/fetch", {"queues": "bad"}),
    ("/workers/fetch", {"queues": ["bad"], "count": 0}),
    ("/workers/fetch", {"queues": ["bad"], "count": True}),
    ("/workers/ack", {"job_id": ["x"]}),
    ("/workers/nack", {"job_id": 7, "error": "x"}),
    ("/workers/heartbeat", {"worker_id": {}, "active_jobs": 3}),
    ("/workflows", {"type": "chain"}),
    ("/workflows", {"type": "spiral", "steps": []}),
    ("/workflows", {"type": "chain", "steps": [{"type": 3}]}),
    ("/workflows", {"type": "group", "jobs": "x"}),
    ("/cron", {"name": "c", "expression": "61 * * * *", "job_template": {"type": "a.b"}}),
    ("/cron", {"name": "c", "expression": "* * * * *", "timezone": "Mars/Olympus", "job_template": {"type": "a.b"}}),
    ("/cron", {"name": 4, "expression": "* * * * *"}),
]
GET_PATHS = ["/jobs/%2e%2e%2f", "/jobs/" + "x" * 5000, "/workflows/nope", "/queues/*>/stats",
             "/events?after=abc", "/events?limit=zz", "/dead-letter?limit=-5"]
OTHER = [("DELETE", "/cron/%00"), ("DELETE", "/workflows/nope"), ("DELETE", "/dead-letter/nope"),
         ("POST", "/queues/has space/pause"), ("POST", "/queues/a*b/resume"), ("PUT", "/jobs"),
         ("PATCH", "/workers/fetch"), ("GET", "/no/such/path"), ("POST", "/admin/reset")]


@pytest.fixture
async def server(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()  # not test mode: reset is 404
    yield server
    server.stop()


def assert_ojs_error(status: int, headers, text: str, what: str) -> None:
    assert 400 <= status < 500, f"{what}: {status} {text[:300]}"
    assert headers["Content-Type"] == "application/openjobspec+json", what
    assert headers["OJS-Version"] == "1.0", what
    error = json.loads(text)["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str), what


async def test_every_malformed_request_is_a_4xx_with_the_ojs_error_and_changes_nothing(server):
    base = server.url + "/ojs/v1"
    async with aiohttp.ClientSession(headers={"Content-Type": "application/openjobspec+json"}) as http:
        async with http.post(base + "/jobs", json=JOB) as response:
            before = (await response.json())["job"]
        for path in POST_PATHS:
            for body in BODIES:
                async with http.post(base + path, data=body) as response:
                    assert_ojs_error(response.status, response.headers, await response.text(), f"{path} {body[:20]!r}")
        for path, body in WRONG_FIELDS:
            async with http.post(base + path, json=body) as response:
                assert_ojs_error(response.status, response.headers, await response.text(), f"{path} {str(body)[:80]}")
        for path in GET_PATHS:
            async with http.get(base + path) as response:
                assert_ojs_error(response.status, response.headers, await response.text(), path)
        for method, path in OTHER:
            async with http.request(method, base + path, data=b"{") as response:
                assert_ojs_error(response.status, response.headers, await response.text(), f"{method} {path}")
                if response.status == 405:  # RFC 9110 15.5.6: what the path does take
                    assert response.headers.get("Allow"), f"{method} {path}: a 405 without Allow"
        async with http.patch(base + f"/jobs/{before['id']}") as response:  # two routes share the path
            assert response.status == 405 and response.headers["Allow"] == "DELETE, GET, HEAD"
        async with http.get(base + f"/jobs/{before['id']}") as response:
            after = (await response.json())["job"]
        async with http.get(base + "/queues/bad/stats") as response:
            stats = (await response.json())["queue"]
    assert server.proc.poll() is None, server.log()[-2000:]
    assert after == before, "a bad request changed a job"
    assert stats["available"] == 1 and stats["active"] == 0, "a bad request enqueued or claimed something"
    assert "Traceback" not in server.log(), server.log()[-3000:]


async def test_an_ack_may_wait_only_as_long_as_the_header_allows_and_a_bad_value_changes_nothing(server):
    """X-Seamq-May-Wait (seamq's worker: its acks may wait up to 50 ms to share a batch): whole
    milliseconds up to 50, else 400 and the job stays as it was."""
    base = server.url + "/ojs/v1"
    async with aiohttp.ClientSession(headers={"Content-Type": "application/openjobspec+json"}) as http:
        async with http.post(base + "/jobs", json={**JOB, "options": {"queue": "waits"}}) as response:
            job_id = (await response.json())["job"]["id"]
        async with http.post(base + "/workers/fetch", json={"queues": ["waits"], "worker_id": "w"}) as response:
            assert [j["id"] for j in (await response.json())["jobs"]] == [job_id]
        for bad in ("abc", "51", "-1", "1.5", "9" * 400, "0x10", "5e1", "", "5 ms"):
            async with http.post(base + "/workers/ack", json={"job_id": job_id},
                                 headers={"X-Seamq-May-Wait": bad}) as response:
                text = await response.text()
                assert_ojs_error(response.status, response.headers, text, bad)
                assert response.status == 400 and "X-Seamq-May-Wait" in text, (bad, text)
        async with http.get(base + f"/jobs/{job_id}") as response:
            assert (await response.json())["job"]["state"] == "active"
        async with http.post(base + "/workers/ack", json={"job_id": job_id},
                             headers={"X-Seamq-May-Wait": "50"}) as response:
            assert response.status == 200 and (await response.json())["state"] == "completed"
    assert "Traceback" not in server.log(), server.log()[-3000:]
