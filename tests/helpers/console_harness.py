"""The console's test harness: `seamq console`, `seamq consume` and `seamq jobs serve` as processes on
nats-server, PostgreSQL and a handler service of their own; dead letters planted through the real
consumer; and what a browser test does to sign in, find a button and post a form."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psycopg
from selenium.webdriver.common.by import By

from seamq.embedded import NatsServer, free_port
from seamq.model import Header, message_headers
from seamq.nats.connect import connect
from seamq.settings import NatsSettings

from helpers.browser import Browser
from helpers import FAST_TOPOLOGY, SEAMQ
from helpers.handler_service import HandlerService
from helpers.jobs_harness import JobServer
from helpers.consumer import CONSUMER, vibe

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"
USERS = "ada:ada-pass-7:admin,vic:vic-pass-9:viewer"


class Stack:
    def __init__(self, folder: Path, dsn: str) -> None:
        self.folder, self.dsn = folder, dsn
        self.nats = NatsServer(folder / "nats")
        self.service = HandlerService()
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A second consumer that no process runs: what the overview says it has pending is JetStream's.
        (folder / "topology.yaml").write_text(FAST_TOPOLOGY + "  vibespro__from_sea: {ack_wait: 2s, max_deliver: 4}\n")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_") and k != "PGAPPNAME"}
        env.update(SEAMQ_DATABASE_URL=self.dsn, SEAMQ_NATS__URL=self.nats.url, SEAMQ_CONSOLE__USERS=USERS,
                   SEAMQ_CONSUMER__HANDLER_SECRET="test-secret", SEAMQ_JOBS__URL=self.jobs.url,
                   SEAMQ_TOPOLOGY_FILE=str(self.folder / "topology.yaml"), PYTHONUNBUFFERED="1")
        return env

    def start(self) -> "Stack":
        self.nats.start()
        self.service.__enter__()
        self.jobs = JobServer(self.nats.url, self.folder / "jobs.log").start()
        subprocess.run([*SEAMQ, "provision"], env=self.env(), check=True, capture_output=True, timeout=120)
        self.spawn("consume", [*SEAMQ, "consume", "--consumer", CONSUMER, "--handler-url", self.service.url])
        self.spawn("console", [*SEAMQ, "console", "--port", str(self.port)])
        deadline = time.monotonic() + 60
        while not _answers(self.url + "/login"):
            assert time.monotonic() < deadline, (self.folder / "console.log").read_text()[-3000:]
            time.sleep(0.1)
        return self

    def spawn(self, name: str, args: list[str]) -> None:
        with open(self.folder / f"{name}.log", "ab") as log:
            self.procs.append(subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.jobs.stop()
        self.service.__exit__(None, None, None)
        self.nats.kill()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.folder.glob("*.log"))

    def sql(self, statement: str, *args) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, args)
            return cur.fetchall() if cur.description else []

    def row(self, message_id) -> dict:
        with psycopg.connect(self.dsn) as conn:
            cur = conn.execute("SELECT * FROM inbox_messages WHERE consumer = %s AND message_id = %s",
                               (CONSUMER, message_id))
            found = cur.fetchone()
            return dict(zip([c.name for c in cur.description], found)) if found else {}

    def nats_call(self, work):
        async def go():
            nc = await connect(NatsSettings(url=self.nats.url), name="test", persistent=False)
            try:
                return await work(nc.jetstream())
            finally:
                await nc.close()
        return asyncio.run(go())

    def plant_live(self, count: int) -> list[str]:
        """Publish events the consumer handles at once (the service answers ok)."""
        ids = []

        async def go(js):
            for _ in range(count):
                event = vibe(f"live-{uuid.uuid4().hex[:6]}", n=1)
                await js.publish(str(event.subject), json.dumps(event.payload).encode(), headers=message_headers(event))
                ids.append(str(event.id))

        self.nats_call(go)
        return ids

    def plant(self, poison: int = 0, bad_json: int = 0, no_aggregate: int = 0) -> dict[str, list[str]]:
        """Publish messages that the consumer dead-letters, each kind for its own cause; wait until it has."""
        planted = {"poison": [], "bad_json": [], "no_aggregate": []}

        async def go(js):
            for kind, count in (("poison", poison), ("bad_json", bad_json), ("no_aggregate", no_aggregate)):
                for _ in range(count):
                    event = vibe(f"{kind}-{uuid.uuid4().hex[:6]}", n=1)
                    headers, data = message_headers(event), json.dumps(event.payload).encode()
                    if kind == "poison":
                        self.service.handler.script[event.aggregate_id] = ["poison"]
                    elif kind == "bad_json":
                        data = b'{"n": 1, oops'
                    else:
                        del headers[Header.AGGREGATE_ID]
                    await js.publish(str(event.subject), data, headers=headers)
                    planted[kind].append(str(event.id))

        self.nats_call(go)
        ids = [i for kind in planted.values() for i in kind]
        wait_until(lambda: all(self.row(i).get("status") == "dead_lettered" for i in ids), "dead-lettered")
        return planted


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False


def wait_until(ready, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.1)


def sign_in(b: Browser, url: str, name: str, password: str, expect: str | None = None) -> None:
    b.open(url + "/login", "Sign in")
    b.driver.find_element(By.NAME, "username").send_keys(name)
    b.driver.find_element(By.NAME, "password").send_keys(password)
    b.driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
    b.wait_until(lambda: b.driver.current_url.rstrip("/") == url if expect is None else expect in b.text(),
                 f"signed in as {name}")


def button(b: Browser, text: str, scope=None):
    for element in (scope or b.driver).find_elements(By.TAG_NAME, "button"):
        if element.text.strip() == text:
            return element
    raise AssertionError(f"no button {text!r}; the page shows:\n{b.text()[:1500]}")


def post(url: str, path: str, fields: dict | list, cookie: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url + path, data=urllib.parse.urlencode(fields, doseq=True).encode(),
                                     method="POST", headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class _Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def answer_of(url: str, path: str, cookie: str) -> tuple[int, str]:
    """A GET's status, and where a redirect would send the browser, without following it."""
    request = urllib.request.Request(url + path, headers={"Cookie": cookie})
    try:
        with urllib.request.build_opener(_Stay).open(request, timeout=30) as answer:
            return answer.status, ""
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers.get("Location", "")


def sign_in_cookie(url: str, name: str, password: str) -> str:
    """A session cookie from a sign-in outside the browser (another device of the same user)."""
    import http.cookiejar

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _Stay)
    csrf = re.search(r'name="csrf" value="([^"]+)"', opener.open(url + "/login").read().decode())[1]
    try:
        opener.open(url + "/login", urllib.parse.urlencode({"csrf": csrf, "username": name,
                                                             "password": password}).encode())
    except urllib.error.HTTPError as answer:
        assert answer.code == 303, answer.code
    return "seamq_console=" + next(c.value for c in jar if c.name == "seamq_console")


def sign_in_redirect(url: str, name: str, password: str, next_path: str) -> str:
    """Where a sign-in with `next` sends the browser (the Location of its 303), without following it."""
    import http.cookiejar
    import re

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), Stay)
    csrf = re.search(r'name="csrf" value="([^"]+)"', opener.open(url + "/login").read().decode())[1]
    body = urllib.parse.urlencode({"csrf": csrf, "username": name, "password": password, "next": next_path})
    try:
        opener.open(url + "/login", body.encode())
    except urllib.error.HTTPError as answer:
        return answer.headers["Location"]
    raise AssertionError("a sign-in did not redirect")
