"""The operations console in a real browser (headless Chromium, Selenium) against real services:
`seamq console`, `seamq consume` and `seamq jobs serve` as processes, nats-server, PostgreSQL and a
handler service. Dead letters of three causes are planted through the real consumer; each action
taken in the browser is then checked in PostgreSQL and in the streams."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from nats.js.errors import NotFoundError
from selenium.webdriver.common.by import By

from seamq import outbox
from seamq.embedded import NatsServer, free_port
from seamq.model import Header, message_headers
from seamq.testing import _TEMPLATE

from helpers.browser import Browser
from helpers import SEAMQ
from helpers.console_harness import (
    SHOTS, Stack, answer_of, button, post, sign_in, sign_in_cookie, sign_in_redirect, wait_until,
)
from helpers import read_stream, wait_for
from helpers.consumer import CONSUMER, vibe


@pytest.fixture(scope="module")
def stack(tmp_path_factory, seamq_postgres):
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = seamq_postgres.create_database(name, template=_TEMPLATE)
    built = Stack(tmp_path_factory.mktemp("console"), dsn)
    try:
        yield built.start()
    except BaseException:
        print(built.logs()[-5000:], file=sys.stderr)
        raise
    finally:
        built.stop()
        seamq_postgres.drop_database(name)


@pytest.fixture
def browser(tmp_path):
    with Browser(tmp_path / "chromium") as opened:
        yield opened


def test_sign_in_and_out_a_viewer_sees_no_action_and_is_refused_one_and_a_post_needs_the_csrf_token(stack, browser):
    b = browser
    b.open(stack.url + "/dead-letters", "Sign in")  # a stranger is sent to sign in
    sign_in(b, stack.url, "ada", "wrong", expect="do not match")
    sign_in(b, stack.url, "ada", "ada-pass-7")
    assert "ada (admin)" in b.text()
    kept = "seamq_console=" + b.driver.get_cookie("seamq_console")["value"]
    assert answer_of(stack.url, "/dead-letters", kept)[0] == 200
    elsewhere = sign_in_cookie(stack.url, "ada", "ada-pass-7")  # another browser of ada's
    button(b, "Sign out").click()
    b.wait_for("Sign in")
    b.open(stack.url + "/", "Sign in")  # signed out means signed out
    for cookie in (kept, elsewhere):  # a cookie kept from before sign-out opens nothing, nor does ada's other one
        assert answer_of(stack.url, "/dead-letters", cookie) == (303, "/login?next=/dead-letters")
    for elsewhere in ("//evil.example/x", "/\\evil.example", "https://evil.example"):  # never sent to another site
        assert sign_in_redirect(stack.url, "ada", "ada-pass-7", elsewhere) == "/"
    assert sign_in_redirect(stack.url, "ada", "ada-pass-7", "/jobs?queue=a") == "/jobs?queue=a"

    planted = stack.plant(poison=1)
    sign_in(b, stack.url, "vic", "vic-pass-9")
    b.open(stack.url + "/dead-letters", "dead letters")
    assert not [e for e in b.driver.find_elements(By.TAG_NAME, "button") if e.text.strip() != "Sign out"
                and e.text.strip() != "Filter"], "a viewer sees an action button"
    cookie = "seamq_console=" + b.driver.get_cookie("seamq_console")["value"]
    csrf = re.search(r'name="csrf" value="([^"]+)"', b.driver.page_source)[1]
    key = f"{CONSUMER}:{planted['poison'][0]}"
    status, page = post(stack.url, "/dead-letters/act", {"csrf": csrf, "action": "purge", "key": key}, cookie)
    assert status == 403 and "may only look" in page
    assert not stack.row(planted["poison"][0])["dlq_metadata"].get("purged_at")
    refused = stack.sql("SELECT actor, selected, done, detail FROM operator_actions WHERE action = 'console.refused' "
                        "ORDER BY id")
    assert [(a, s, d, x["path"], x["status"]) for a, s, d, x in refused][-1:] == \
        [("console:vic", 0, 0, "/dead-letters/act", 403)], refused
    assert "console_refused" in (stack.folder / "console.log").read_text()

    sign_in(b, stack.url, "ada", "ada-pass-7")
    cookie = "seamq_console=" + b.driver.get_cookie("seamq_console")["value"]
    status, page = post(stack.url, "/dead-letters/act", {"action": "purge", "key": key}, cookie)  # no token
    assert status == 403 and "CSRF" in page
    status, page = post(stack.url, "/dead-letters/act", {"csrf": "forged", "action": "purge", "key": key}, cookie)
    assert status == 403
    assert not stack.row(planted["poison"][0])["dlq_metadata"].get("purged_at")
    b.open(stack.url + "/actions", "console.refused")  # the audit shows who was refused what
    assert "console:ada" in b.text() and "console:vic" in b.text()
    assert "ada-pass-7" not in stack.logs() and "vic-pass-9" not in stack.logs()


def test_dead_letters_filtered_opened_replayed_as_a_group_edited_and_replayed_and_purged(stack, browser):
    b = browser
    stack.sql("UPDATE inbox_messages SET dlq_metadata = dlq_metadata || '{\"purged_at\": \"2000-01-01\"}' "
              "WHERE status IN ('dead_lettered', 'exhausted')")  # earlier tests' dead letters out of the way
    planted = stack.plant(poison=2, bad_json=2, no_aggregate=1)
    sign_in(b, stack.url, "ada", "ada-pass-7")

    # Grouped by cause, and filtered by the error's text.
    b.open(stack.url + "/dead-letters", "5 dead letters")
    groups = b.rows()
    assert any("scripted poison" in cause and cells[1] == "2" for cause, cells in groups.items()), groups
    assert any(cause.startswith("invalid_json") and cells[1] == "2" for cause, cells in groups.items()), groups
    assert any(cause.startswith("invalid_envelope") and cells[1] == "1" for cause, cells in groups.items()), groups
    assert any("HTTP 422:" in cause for cause in groups), groups  # the handler's status, not blanked as an id
    listed = b.driver.find_element(By.ID, "dead-letters").text
    assert "vibe_created.v1" in listed and "vibespro.event." not in listed  # unreadable ones named alike
    SHOTS.mkdir(parents=True, exist_ok=True)
    b.driver.save_screenshot(str(SHOTS / "console-dead-letters.png"))
    field = b.driver.find_element(By.NAME, "text")
    field.send_keys("scripted poison")
    button(b, "Filter").click()
    b.wait_for("2 dead letters")
    shown = b.driver.find_element(By.ID, "dead-letters").text
    # Whole ids: their first 13 characters are their millisecond, which messages published together share.
    assert all(i in shown for i in planted["poison"]) and not any(i in shown for i in planted["bad_json"])

    # One message's page: envelope, body, attempts.
    b.driver.find_element(By.LINK_TEXT, planted["poison"][0]).click()
    b.wait_for(f"Dead letter {planted['poison'][0]}")
    assert "scripted poison" in b.driver.find_element(By.ID, "attempts").text
    assert '"n": 1' in b.driver.find_element(By.ID, "body").text
    b.driver.save_screenshot(str(SHOTS / "console-message.png"))

    # Replay the group of two; a third of the same cause arriving after the confirmation was shown is not swept in.
    b.open(stack.url + "/dead-letters", "By cause")
    row = next(r for r in b.driver.find_elements(By.CSS_SELECTOR, "#groups tbody tr") if "scripted poison" in r.text)
    button(b, "Replay group", row).click()
    b.wait_for("Replay 2 dead letters?")
    late = stack.plant(poison=1)["poison"][0]
    button(b, "Replay 2").click()
    b.wait_for("dlq.replay: 2 of 2 done")
    wait_until(lambda: all(stack.row(i)["status"] == "processed" for i in planted["poison"]), "replayed and handled")
    assert stack.row(late)["status"] == "dead_lettered"
    assert all(stack.service.handler.handled[i] == 1 for i in planted["poison"])
    replays = [m.headers for m in stack.nats_call(lambda js: read_stream(js, "VIBESPRO_EVENTS"))
               if (m.headers or {}).get("Seamq-Replay-Attempt")]
    assert sorted(h["Seamq-Message-Id"] for h in replays) == sorted(planted["poison"])  # one copy each, not the late

    # Edit and replay: a new message that names the original; the original is closed; both are kept.
    original = planted["bad_json"][0]
    b.open(f"{stack.url}/dead-letters/{CONSUMER}/{original}", "Edit and replay")
    editor = b.driver.find_element(By.NAME, "body")
    editor.clear()
    editor.send_keys('{"n": 7, "fixed": true}')
    button(b, "Replay the edited copy").click()
    b.wait_for("Edited and replayed as a new message")
    new_id = b.driver.find_element(By.ID, "edited-as").text.strip()
    uuid.UUID(new_id)
    assert stack.row(original)["dlq_metadata"]["edited_as"] == new_id and stack.row(original)["status"] == "exhausted"
    closed = b.driver.find_element(By.CSS_SELECTOR, "p.note[role=status]")  # news, not an error
    assert "Closed" in b.text() and "warn" not in closed.get_attribute("class")
    assert b.driver.find_element(By.ID, "status").text == "closed: edited and replayed"
    assert b.driver.find_element(By.ID, "handler-attempts").text.startswith("0 (dead-lettered before")
    assert b.driver.find_element(By.ID, "replays").text == "Not replayed."
    wait_until(lambda: stack.row(new_id).get("status") == "processed", "the edited copy handled")
    copies = [m for m in stack.nats_call(lambda js: read_stream(js, "VIBESPRO_EVENTS"))
              if (m.headers or {}).get(Header.MSG_ID) == new_id]
    assert len(copies) == 1 and copies[0].headers["Seamq-Edit-Of"] == original
    assert json.loads(copies[0].data) == {"n": 7, "fixed": True}
    assert "dlq.edit_replay" in b.driver.find_element(By.ID, "history").text

    # Purge one: its DLQ copy is gone from the stream; its inbox row stays, marked.
    purged = planted["no_aggregate"][0]
    seq = stack.row(purged)["dlq_metadata"]["dlq_seq"]
    b.open(f"{stack.url}/dead-letters/{CONSUMER}/{purged}", "Envelope")
    button(b, "Purge").click()
    b.wait_for("Purge 1 dead letter?")
    assert b.driver.find_element(By.ID, "confirm-text").text.startswith("Purge exactly this dead letter.")
    button(b, "Purge 1").click()
    b.wait_for("dlq.purge: 1 of 1 done")
    assert stack.row(purged)["dlq_metadata"]["purged_at"]

    async def gone(js):
        try:
            await js.get_msg("SEA_DLQ", seq)
            return False
        except NotFoundError:
            return True
    assert stack.nats_call(gone)

    actions = stack.sql("SELECT actor, action, selected, done FROM operator_actions WHERE finished_at IS NOT NULL "
                        "ORDER BY id")
    assert ("console:ada", "dlq.replay", 2, 2) in actions and ("console:ada", "dlq.purge", 1, 1) in actions
    assert ("console:ada", "dlq.edit_replay", 1, 1) in actions
    b.open(stack.url + "/actions", "Actions")
    assert "{}" not in b.driver.find_element(By.ID, "actions").text  # an empty detail is a dash
    assert not b.errors()


def test_the_overview_shows_what_postgresql_and_jetstream_hold(stack, browser):
    b = browser

    async def pending(js):  # events for a consumer no process runs: they wait in JetStream
        for n in range(3):
            event = vibe(f"o-{n}", n=n)
            subject = str(event.subject).replace("vibespro.", "sea.", 1)
            headers = message_headers(event)
            await js.publish(subject, b"{}", headers=headers)
        # A consumer's pending count follows its stream's stored messages a moment later (2 of 3 read
        # right after the publishes were acked, on a busy machine).
        return await wait_for(lambda: _at_least(js, 3), timeout=10, what="3 events pending")

    async def _at_least(js, n):  # the count once it is n or more (0: not yet)
        count = (await js.consumer_info("SEA_EVENTS", "vibespro__from_sea")).num_pending
        return count if count >= n else 0
    waiting = stack.nats_call(pending)
    with psycopg.connect(stack.dsn) as conn:  # no relay runs: they wait in the outbox
        for n in range(4):
            outbox.add(conn, vibe(f"backlog-{n}", n=n))
    sign_in(b, stack.url, "ada", "ada-pass-7")
    b.wait_until(lambda: "vibespro__from_sea" in b.driver.find_element(By.ID, "consumers").text, "the consumers")
    b.wait_until(lambda: "samples" in b.text(), "a chart")
    dead = {c: n for c, n in stack.sql("SELECT consumer, count(*) FROM inbox_messages WHERE status IN "
                                       "('dead_lettered', 'exhausted') AND dlq_metadata->>'purged_at' IS NULL AND "
                                       "dlq_metadata->>'edited_as' IS NULL GROUP BY consumer")}
    consumers = b.rows()
    assert consumers["vibespro__from_sea"][5] == str(waiting), consumers  # pending, as JetStream says
    assert consumers[CONSUMER][9] == str(dead.get(CONSUMER, 0)), consumers
    shown = {r[0]: r for r in b.rows().values() if r[0] in ("sea", "vibespro")}
    backlog = dict(stack.sql("SELECT context, count(*) FROM outbox_events WHERE published_at IS NULL GROUP BY 1"))
    assert shown["vibespro"][1] == str(backlog["vibespro"]) == "4", shown
    b.driver.save_screenshot(str(SHOTS / "console-overview.png"))
    b.driver.set_window_size(390, 844)  # a phone
    b.open(stack.url + "/", "Consumers")
    width = b.driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, f"the page is {width} px wide on a 390 px screen"
    b.driver.set_window_size(1600, 1000)
    assert not b.errors()


def test_a_dead_job_is_retried_from_the_jobs_page(stack, browser):
    b = browser

    async def dead_job():
        from seamq.jobs.client import JobsClient
        async with JobsClient(stack.jobs.url) as jobs:
            job = await jobs.push("report.build", [1], queue="reports", options={"retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}})
            [taken] = await jobs.fetch(["reports"])
            await jobs.save_checkpoint(taken["id"], {"printed_pages": 12})
            await jobs.nack(taken["id"], RuntimeError("the printer is on fire"))
            return job["id"]
    job_id = asyncio.run(dead_job())
    sign_in(b, stack.url, "ada", "ada-pass-7")
    b.open(stack.url + "/jobs", "Dead jobs (1)")
    assert "the printer is on fire" in b.driver.find_element(By.ID, "dead-jobs").text
    row = next(r for r in b.driver.find_elements(By.CSS_SELECTOR, "#dead-jobs tbody tr") if job_id in r.text)
    button(b, "Retry", row).click()
    b.wait_for("state: available")
    assert "saved 1 time(s)" in b.driver.find_element(By.ID, "job-checkpoint").text  # kept through the retry
    assert '"printed_pages": 12' in b.driver.find_element(By.ID, "job-checkpoint").find_element(
        By.XPATH, "following-sibling::pre").text
    with urllib.request.urlopen(f"{stack.jobs.url}/ojs/v1/jobs/{job_id}") as answer:
        assert json.loads(answer.read())["job"]["state"] == "available"
    assert ("console:ada", "jobs.retry", 1) in stack.sql("SELECT actor, action, done FROM operator_actions")

    async def more():
        from seamq.jobs.client import JobsClient
        async with JobsClient(stack.jobs.url) as jobs:
            await jobs._call("POST", "/workflows", {"type": "chain", "name": "nightly", "steps": [
                {"type": "report.fetch", "args": [1]}, {"type": "report.print", "args": [2]}]})
            await jobs._call("POST", "/cron", {"name": "hourly-report", "expression": "0 * * * *",
                                               "job_template": {"type": "report.build", "args": [3]}})
            await jobs._call("POST", "/webhooks/subscriptions", {
                "url": "http://hooks:hook-pass-9@127.0.0.1:9/never", "events": ["job.*"], "secret": "s" * 16})
            await jobs.push("report.print", [5], options={"queue": "printing",
                                                            "rate_limit": {"key": "printer:hall", "concurrency": 2}},
                            meta={"tenant_id": "acme:eu"})
    asyncio.run(more())
    b.open(stack.url + "/jobs/cron-and-workflows", "hourly-report")
    assert "0 * * * *" in b.driver.find_element(By.ID, "crons").text
    limited = b.driver.find_element(By.ID, "rate-limits").text
    assert "printer:hall" in limited and "0 / 2" in limited and "wait" in limited
    tenant_row = next(r for r in b.driver.find_elements(By.CSS_SELECTOR, "#tenants tbody tr") if "acme:eu" in r.text)
    assert tenant_row.text.split()[1:2] == ["1"] and "printing" in tenant_row.text  # its one job, available
    hooks = b.driver.find_element(By.CSS_SELECTOR, "[id^=webhook-]").text
    assert "127.0.0.1:9/never" in hooks and "job.*" in hooks and "hook-pass-9" not in b.driver.page_source
    steps = b.driver.find_element(By.ID, "workflows").text
    assert "nightly" in steps and "(report.fetch)" in steps and "(report.print)" in steps
    b.open(stack.url + "/jobs?type=report.build&since=2000-01-01T00:00", "Search")
    assert job_id in b.driver.find_element(By.ID, "found").text
    b.open(stack.url + "/jobs?type=report.build&until=2000-01-01T00:00", "Search")
    assert job_id not in b.driver.find_element(By.ID, "found").text


def test_beyond_loopback_without_users_is_refused_with_a_coded_error_and_the_docs_commands_parse(tmp_path):
    from seamq.console.auth import Users
    from helpers.cli import parse_command

    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    result = subprocess.run([*SEAMQ, "console", "--host", "0.0.0.0"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "error[INVALID_CONFIG]" in result.stderr and "SEAMQ_CONSOLE__USERS" in \
        result.stderr and "Traceback" not in result.stderr
    env["SEAMQ_CONSOLE__USERS"] = "ada:pw-never-shown:superuser"
    result = subprocess.run([*SEAMQ, "console"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "error[INVALID_CONFIG]" in result.stderr and "pw-never-shown" not in \
        result.stderr + result.stdout
    docs = (Path(__file__).resolve().parents[3] / "docs" / "console.md").read_text()
    block = re.findall(r"```sh\n(.*?)```", docs, re.S)[0]
    users = re.search(r'SEAMQ_CONSOLE__USERS="([^"]+)"', block)[1]
    assert {name: role for name, (_, role) in Users.parse(users).passwords.items()} == {"ada": "admin",
                                                                                        "vic": "viewer"}
    assert Users.parse("eve:with:colons:viewer").passwords == {"eve": ("with:colons", "viewer")}
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("seamq ")]
    assert commands == ["seamq console"]
    for command in commands:
        parse_command(command.split())


def test_the_overview_counts_live_latency_apart_from_replays_and_every_dead_letter_of_the_hour(stack, browser):
    """A dead letter replayed after it waited is not the pipeline's latency; "dead-lettered, 1 h" counts
    each message dead-lettered in that hour, also one replayed and handled since (issue 44)."""
    b = browser
    sign_in(b, stack.url, "ada", "ada-pass-7")
    b.wait_until(lambda: CONSUMER in b.rows(), "the consumers")
    before = int(b.rows()[CONSUMER][10])
    poison = stack.plant(poison=3)["poison"]
    replayed = subprocess.run([*SEAMQ, "dlq", "replay", poison[0]], env=stack.env(), capture_output=True, text=True,
                              timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    wait_until(lambda: stack.row(poison[0])["status"] == "processed", "the replay handled")
    # As if it had waited an hour for the operator: its event is an hour old.
    stack.sql("UPDATE inbox_messages SET occurred_at = now() - interval '1 hour' WHERE message_id = %s", poison[0])
    live = stack.plant_live(2)
    wait_until(lambda: all(stack.row(i).get("status") == "processed" for i in live), "live deliveries handled")

    b.open(stack.url + "/", "Consumers")
    b.wait_until(lambda: int(b.rows()[CONSUMER][10]) == before + 3, "three more dead-lettered in the hour")
    row = b.rows()[CONSUMER]
    assert row[3] != "-" and float(row[3]) < 600_000, row  # p99 of live deliveries: not the hour-old replay's
    assert int(row[4].split()[0]) >= 1, row  # the replay, counted apart
    b.wait_until(lambda: "whatever became of them since" in b.text("consumers-legend"), "the consumers' legend")

    # Pages that do not exist, and a job that does not: coded pages that say so.
    b.open(stack.url + "/jobs/does-not-exist", "error[NOT_FOUND]")
    assert b.driver.title.startswith("Not found")
    b.open(stack.url + "/nope", "error[NOT_FOUND]")
    assert "no page /nope" in b.text()


def _answering(url: str) -> bool:
    try:
        return answer_of(url, "/login", "")[0] == 200
    except OSError:  # not listening yet
        return False


def test_the_console_starts_while_nats_is_away_and_joins_it_when_it_comes_back(tmp_path, seamq_postgres, browser):
    """The on-call tool opens during a NATS outage (issue 44: it refused to start, BROKER_UNAVAILABLE)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = seamq_postgres.create_database(name, template=_TEMPLATE)
    nats = NatsServer(tmp_path / "nats")  # its port chosen, nothing listening there yet
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_") and k != "PGAPPNAME"}
    env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats.url, PYTHONUNBUFFERED="1")
    log = tmp_path / "console.log"
    with open(log, "wb") as out:
        console = subprocess.Popen([*SEAMQ, "console", "--port", str(port)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: console.poll() is not None or _answering(url), "the console answers")
        assert console.poll() is None, log.read_text()[-3000:]
        browser.open(url + "/", "Outbox, per context")  # open console on loopback: no sign-in
        browser.wait_for("NATS (SEAMQ_NATS__URL): not connected")
        assert browser.rows()[CONSUMER][5] == "unknown"
        nats.start()
        subprocess.run([*SEAMQ, "provision"], env=env, check=True, capture_output=True, timeout=120)
        browser.wait_until(lambda: "not connected" not in browser.text() and
                           browser.rows().get(CONSUMER, [""] * 6)[5] == "0", "JetStream's numbers, once joined")
        text = log.read_text()
        assert text.index("console_serving") < text.index("console_joined_nats") and "Traceback" not in text
    finally:
        console.terminate()
        console.wait(30)
        nats.kill()
        seamq_postgres.drop_database(name)


def test_the_audit_page_shows_what_seamq_audit_found(stack, browser):
    """Events published straight to the stream have no outbox row: `seamq audit --once` and the page say so."""
    b, live = browser, stack.plant_live(3)
    wait_until(lambda: all(stack.row(i).get("status") == "processed" for i in live), "live deliveries handled")
    run = subprocess.run([*SEAMQ, "audit", "--once"], env=stack.env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 3 and all(f"outbox_row_gone vibespro {i}" in run.stdout for i in live), run
    sign_in(browser, stack.url, "vic", "vic-pass-9")
    b.open(stack.url + "/audit", "Latest findings")
    text = {part: b.driver.find_element(By.ID, f"audit-{part}").text for part in ("findings", "summary", "walks")}
    assert all(i in text["findings"] for i in live) and "outbox_row_gone" in text["summary"], text
    assert "stream:vibespro" in text["walks"] and not b.errors()


def test_a_service_away_is_said_on_the_page_and_the_rest_still_shows(stack, browser):
    """Runs last: it stops the job server and NATS under the console."""
    b = browser
    sign_in(b, stack.url, "ada", "ada-pass-7")
    stack.jobs.kill()
    b.open(stack.url + "/jobs", "error[UNAVAILABLE]")
    assert "the job server (SEAMQ_JOBS__URL) does not answer" in b.text()
    stack.nats.kill()
    b.open(stack.url + "/", "Outbox, per context")  # PostgreSQL's numbers, and what could not be read
    b.wait_for("NATS (SEAMQ_NATS__URL): not connected")
    row = b.rows()[CONSUMER]
    assert row[5:9] == ["unknown"] * 4, row  # pending, ack pending, redelivered, pulling: not zeros
    assert "Traceback" not in (stack.folder / "console.log").read_text()

