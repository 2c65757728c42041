"""The admin API (urn:ojs:ext:admin-api) beyond its upstream suite, on a real nats-server: filters and
pages, bulk actions and their interlocks, purge, workers (quiet, deregister), maintenance, stats."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from seamq.jobs.app import build_app
from seamq.jobs.engine import Engine
from seamq.jobs.model import utcnow
from seamq.jobs.nats_store import NatsJobStore

DEAD = {"max_attempts": 1, "on_exhaustion": "dead_letter"}


@pytest.fixture
async def engine(nc):
    engine = await Engine(await NatsJobStore(nc).start()).start()
    yield engine
    await engine.stop()


@pytest.fixture
async def api(engine):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(engine)), base_url="http://ojs") as client:
        yield client


async def push(api, job_type: str, queue: str, **options) -> dict:
    answer = await api.post("/ojs/v1/jobs", json={"type": job_type, "args": [], "options": {"queue": queue, **options}})
    assert answer.status_code == 201, answer.text
    return answer.json()["job"]


async def fail(api, queue: str, worker: str = "w1") -> dict:
    job = (await api.post("/ojs/v1/workers/fetch", json={"queues": [queue], "worker_id": worker})).json()["jobs"][0]
    answer = await api.post("/ojs/v1/workers/nack", json={"job_id": job["id"], "error": {"message": "boom"}})
    return answer.json()["job"]


async def test_lists_filter_and_page_and_refuse_what_they_do_not_understand(api):
    for n in range(25):
        await push(api, "mail.send" if n % 2 else "mail.bounce", "mail")
    await push(api, "report.build", "reports")
    everything = (await api.get("/ojs/v1/admin/jobs")).json()
    assert everything["pagination"] == {"total": 26, "page": 1, "per_page": 20} and len(everything["items"]) == 20
    last = (await api.get("/ojs/v1/admin/jobs?page=2&per_page=20")).json()["items"]
    assert len(last) == 6 and not {j["id"] for j in last} & {j["id"] for j in everything["items"]}
    assert (await api.get("/ojs/v1/admin/jobs?type=mail.*&per_page=100")).json()["pagination"]["total"] == 25
    assert (await api.get("/ojs/v1/admin/jobs?type=mail.send&queue=mail")).json()["pagination"]["total"] == 12
    later = (utcnow() + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert (await api.get(f"/ojs/v1/admin/jobs?since={later}")).json()["pagination"]["total"] == 0
    oldest = (await api.get("/ojs/v1/admin/jobs?order=asc&per_page=1")).json()["items"][0]
    newest = (await api.get("/ojs/v1/admin/jobs?per_page=1")).json()["items"][0]
    assert oldest["type"] == "mail.bounce" and newest["type"] == "report.build"
    for wrong in ("state=done", "since=yesterday", "page=0", "per_page=x", "sort=name", "order=up"):
        answer = await api.get(f"/ojs/v1/admin/jobs?{wrong}")
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_request", wrong


async def test_bulk_actions_need_confirm_and_a_filter_and_count_what_they_did(api):
    kept = await push(api, "a.keep", "other")
    for _ in range(3):
        await push(api, "a.go", "bulk")
    refused = [await api.post("/ojs/v1/admin/jobs/bulk/cancel", json=body) for body in (
        {"filter": {"queue": "bulk"}}, {"filter": {"queue": "bulk"}, "confirm": "yes"}, {"filter": {}, "confirm": True},
        {"filter": {"queue": "bulk", "colour": "red"}, "confirm": True}, {"filter": "bulk", "confirm": True})]
    assert [r.status_code for r in refused] == [400] * 5
    cancelled = (await api.post("/ojs/v1/admin/jobs/bulk/cancel", json={"filter": {"queue": "bulk"},
                                                                        "confirm": True})).json()
    assert cancelled == {"action": "cancel", "matched": 3, "succeeded": 3, "failed": 0, "errors": []}
    retried = (await api.post("/ojs/v1/admin/jobs/bulk/retry", json={"filter": {"state": "cancelled"},
                                                                      "confirm": True})).json()
    assert retried["matched"] == 3 and retried["succeeded"] == 3
    states = {j["state"] for j in (await api.get("/ojs/v1/admin/jobs?queue=bulk")).json()["items"]}
    assert states == {"available"}
    assert (await api.get(f"/ojs/v1/jobs/{kept['id']}")).json()["job"]["state"] == "available"
    one = await api.post(f"/ojs/v1/admin/jobs/{kept['id']}/retry")  # not finished: nothing to retry
    assert one.status_code == 409 and "only discarded or cancelled" in one.json()["error"]["message"]


async def test_purge_deletes_finished_jobs_only_with_confirm(api):
    await push(api, "p.fail", "purge", retry={"max_attempts": 1})
    waiting = await push(api, "p.wait", "purge")
    assert (await fail(api, "purge"))["state"] == "discarded"
    purge = "/ojs/v1/admin/queues/purge/jobs"
    for wrong in ({"states": ["discarded"]}, {"states": ["available"], "confirm": True}, {"states": [], "confirm": True},
                  {"states": ["discarded"], "older_than": "last week", "confirm": True}):
        assert (await api.request("DELETE", purge, json=wrong)).status_code == 400, wrong
    hour_ago = (utcnow() - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    none = await api.request("DELETE", purge, json={"states": ["discarded"], "older_than": hour_ago, "confirm": True})
    assert none.json()["purged_count"] == 0
    purged = await api.request("DELETE", purge, json={"states": ["discarded"], "confirm": True})
    assert purged.json() == {"purged_count": 1, "states": ["discarded"]}
    left = (await api.get("/ojs/v1/admin/jobs?queue=purge")).json()["items"]
    assert [j["id"] for j in left] == [waiting["id"]]


async def test_dead_letters_list_stats_retry_and_delete(api):
    for _ in range(2):
        await push(api, "d.fail", "dead", retry=DEAD)
    first, second = [await fail(api, "dead") for _ in range(2)]
    stats = (await api.get("/ojs/v1/admin/dead-letter/stats")).json()
    assert stats["total"] == 2 and stats["by_queue"] == {"dead": 2} and stats["by_error_type"] == {"InternalServerError": 2}
    listed = (await api.get("/ojs/v1/admin/dead-letter?queue=dead")).json()
    assert {j["id"] for j in listed["items"]} == {first["id"], second["id"]}
    assert (await api.post(f"/ojs/v1/admin/dead-letter/{first['id']}/retry")).json()["job"]["state"] == "available"
    assert (await api.delete(f"/ojs/v1/admin/dead-letter/{second['id']}")).status_code == 204
    assert (await api.get(f"/ojs/v1/jobs/{second['id']}")).status_code == 404
    assert (await api.get("/ojs/v1/admin/dead-letter/stats")).json()["total"] == 0
    detail = (await api.get(f"/ojs/v1/admin/jobs/{first['id']}")).json()
    assert detail["attempt"] == 0 and [e["message"] for e in detail["errors"]] == ["boom"]  # history kept


async def test_a_quiet_worker_is_told_so_and_a_stale_ones_jobs_come_back(api, engine):
    job = await push(api, "w.run", "work")
    await api.post("/ojs/v1/workers/fetch", json={"queues": ["work"], "worker_id": "w-stale"})
    listed = (await api.get("/ojs/v1/admin/workers")).json()
    assert listed["summary"]["running"] == 1 and listed["items"][0]["active_jobs"] == 1
    refused = await api.delete("/ojs/v1/admin/workers/w-stale")
    assert refused.status_code == 409 and "only a stale worker" in refused.json()["error"]["message"]
    assert (await api.post("/ojs/v1/admin/workers/w-stale/quiet")).json()["state"] == "quiet"
    beat = (await api.post("/ojs/v1/workers/heartbeat", json={"worker_id": "w-stale", "active_jobs": [job["id"]]})).json()
    assert beat["state"] == "quiet" and beat["jobs_extended"] == [job["id"]]
    worker = engine.workers.known["w-stale"]
    worker.asked, worker.last_seen_at = None, utcnow() - timedelta(minutes=5)  # silent for 5 minutes
    assert (await api.get("/ojs/v1/admin/workers")).json()["summary"]["stale"] == 1
    gone = (await api.delete("/ojs/v1/admin/workers/w-stale")).json()
    assert gone["released_jobs"] == [job["id"]]
    back = (await api.get(f"/ojs/v1/admin/jobs/{job['id']}")).json()
    assert back["state"] == "available" and back["errors"][-1]["code"] == "worker_lost"
    assert (await api.get("/ojs/v1/admin/workers")).json()["items"] == []


async def test_maintenance_stops_every_fetch_until_it_ends(api):
    await push(api, "m.run", "maint")
    on = (await api.post("/ojs/v1/admin/system/maintenance", json={"enabled": True, "reason": "db upgrade"})).json()
    assert on["enabled"] is True and on["reason"] == "db upgrade"
    assert (await api.post("/ojs/v1/workers/fetch", json={"queues": ["maint"]})).json()["jobs"] == []
    assert (await api.post("/ojs/v1/jobs", json={"type": "m.run", "args": []})).status_code == 201  # still taken
    assert (await api.post("/ojs/v1/admin/system/maintenance", json={"enabled": "yes"})).status_code == 400
    await api.post("/ojs/v1/admin/system/maintenance", json={"enabled": False})
    assert len((await api.post("/ojs/v1/workers/fetch", json={"queues": ["maint"]})).json()["jobs"]) == 1


async def test_stats_and_history_count_what_happened(api):
    await push(api, "s.ok", "stats")
    await push(api, "s.bad", "stats", retry={"max_attempts": 1})
    job = (await api.post("/ojs/v1/workers/fetch", json={"queues": ["stats"]})).json()["jobs"][0]
    await api.post("/ojs/v1/workers/ack", json={"job_id": job["id"]})
    await fail(api, "stats")
    stats = (await api.get("/ojs/v1/admin/stats")).json()
    assert stats["jobs"]["completed"] == 1 and stats["jobs"]["discarded"] == 1 and stats["queues"] >= 2
    assert stats["throughput"]["processed_per_minute"] > 0 and stats["throughput"]["failed_per_minute"] > 0
    history = (await api.get("/ojs/v1/admin/stats/history?period=1m&queue=stats")).json()
    assert sum(p["processed"] for p in history["data"]) == 1 and sum(p["failed"] for p in history["data"]) == 1
    assert sum(p["enqueued"] for p in history["data"]) == 2
    assert (await api.get("/ojs/v1/admin/stats/history?period=2m")).status_code == 400
