"""The official OJS admin UI (../shared/ojs-admin-ui), built from its source and served by
`seamq jobs serve --admin-ui`, in headless Chromium: every page it links shows what the server holds,
with no error in the browser's console, and its actions (pause a queue, retry a dead letter) change
the server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from helpers.jobs_harness import served
from helpers.sdk_harness import admin_ui
from helpers.browser import Browser

PAGES = ["", "queues", "jobs", "scheduled", "workers", "crons", "workflows", "rate-limits", "unique-jobs", "events",
         "dead-letter", "schemas", "settings"]


def call(url: str, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, method=method, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(tmp_path_factory, "admin-ui", extra=("--admin-ui", str(admin_ui()))) as url:
        for n in range(3):
            call(url, "POST", "/ojs/v1/jobs", {"type": "email.send", "args": [n], "options": {"queue": "emails"}})
        call(url, "POST", "/ojs/v1/jobs", {"type": "report.build", "args": [1], "options": {"queue": "reports"}})
        call(url, "POST", "/ojs/v1/jobs", {"type": "report.fail", "args": [2], "options": {
            "queue": "reports", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}})
        for job in call(url, "POST", "/ojs/v1/workers/fetch", {"queues": ["reports"], "count": 2,
                                                                  "worker_id": "ui-worker-1"})["jobs"]:
            if job["type"] == "report.fail":
                call(url, "POST", "/ojs/v1/workers/nack", {"job_id": job["id"], "error": {
                    "message": "smtp down", "details": {"traceback": "Traceback (most recent call last):\n"
                                                                     "ConnectionError: smtp down"}}})
            else:
                call(url, "POST", "/ojs/v1/workers/ack", {"job_id": job["id"], "result": {"rows": 3}})
        call(url, "POST", "/ojs/v1/workers/fetch", {"queues": ["emails"], "count": 1, "worker_id": "ui-worker-1"})
        call(url, "POST", "/ojs/v1/cron", {"name": "nightly-report", "expression": "0 3 * * *",
                                           "job_template": {"type": "report.build", "args": []}})
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser(tmp_path_factory.mktemp("chromium")) as opened:
        yield opened


def test_every_page_shows_without_an_error(server, browser):
    for page in PAGES:
        browser.open(f"{server}/ojs/admin/{page}", "Open Job Spec Admin")
        text = browser.text()
        assert "Something went wrong" not in text and "Failed to connect" not in text, f"/{page}: {text[:500]}"
        assert browser.errors() == [], f"/{page}"


def test_the_dashboard_queues_and_workers_show_what_the_server_holds(server, browser):
    browser.open(f"{server}/ojs/admin/", "WORKERS")
    browser.wait_for("emails")
    browser.open(f"{server}/ojs/admin/queues", "reports")
    rows = browser.rows()
    assert ["emails", "2", "1"] == rows["emails"][:3]  # available, active
    browser.open(f"{server}/ojs/admin/workers", "ui-worker-1")
    assert browser.rows()["ui-worker-1"][4] == "1"  # the job it holds, from the records
    browser.open(f"{server}/ojs/admin/jobs", "report.fail")
    assert {"email.send", "report.build", "report.fail"} <= set(browser.text().split())


def test_a_job_shows_its_failed_attempts(server, browser):
    dead = call(server, "GET", "/ojs/v1/admin/dead-letter")["items"][0]
    browser.open(f"{server}/ojs/admin/jobs", "report.fail")
    browser.click_text("report.fail")
    browser.wait_for("smtp down")
    assert "ConnectionError" in browser.text() and dead["id"] in browser.text()
    assert browser.errors() == []


def test_pausing_a_queue_in_the_ui_pauses_it_on_the_server(server, browser):
    browser.open(f"{server}/ojs/admin/queues", "reports")
    browser.click_in_row("reports", "Pause")
    browser.wait_for_row("reports", "Resume")
    assert call(server, "GET", "/ojs/v1/admin/queues/reports")["paused"] is True
    assert call(server, "POST", "/ojs/v1/workers/fetch", {"queues": ["reports"]})["jobs"] == []
    browser.click_in_row("reports", "Resume")
    browser.wait_for_row("reports", "Pause")
    assert call(server, "GET", "/ojs/v1/admin/queues/reports")["paused"] is False


def test_retrying_a_dead_letter_in_the_ui_makes_it_available(server, browser):
    dead = call(server, "GET", "/ojs/v1/admin/dead-letter")["items"][0]
    browser.open(f"{server}/ojs/admin/dead-letter", "report.fail")
    browser.click_label(f"Retry job {dead['id'][:12]}")
    browser.wait_until(lambda: call(server, "GET", f"/ojs/v1/jobs/{dead['id']}")["job"]["state"] == "available")
    job = call(server, "GET", f"/ojs/v1/admin/jobs/{dead['id']}")
    assert job["attempt"] == 0 and [e["message"] for e in job["errors"]] == ["smtp down"]  # history kept
    assert call(server, "GET", "/ojs/v1/admin/dead-letter/stats")["total"] == 0
    assert browser.errors() == []


def test_the_ui_is_served_from_its_folder_only(server):
    for path in ("/ojs/admin/../../etc/passwd", "/ojs/admin/%2e%2e/%2e%2e/etc/passwd", "/ojs/admin/assets/../../x"):
        try:
            with urllib.request.urlopen(server + path, timeout=10) as response:
                assert b"root:" not in response.read()
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
