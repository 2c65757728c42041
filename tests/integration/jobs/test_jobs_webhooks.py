"""Webhooks (issue 49): a receiver down for 30 s gets every event after it comes back, each once by its
id, every signature verified; the attempts the downtime cost are in the deliveries' records. Two job
servers share the deliveries (each batch of events and each delivery goes to one of them)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

import aiohttp
from aiohttp import web

from seamq.embedded import free_port
from seamq.jobs.client import JobsClient

from helpers.jobs_harness import JobServer

SECRET = "whsec_test_secret_0123456789"
DOWN_FOR = 30.0  # seconds the receiver is away
RETRY_DELAYS = json.dumps([3.0] * 20)
LOCAL = {"SEAMQ_JOBS__WEBHOOK_PRIVATE_ADDRESSES": "true"}  # the receivers are on 127.0.0.1  # an attempt every 3 s, for 60 s: twice the downtime


class Receiver:
    """A webhook endpoint on 127.0.0.1 that can be stopped and started again on its port."""

    def __init__(self) -> None:
        self.port, self.got, self.runner = free_port(), [], None

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.read()
        timestamp, signature = request.headers["X-OJS-Timestamp"], request.headers["X-OJS-Signature"]
        expected = "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        self.got.append({"delivery": request.headers["X-OJS-Delivery-ID"], "signed": hmac.compare_digest(signature, expected),
                         "event": json.loads(body)})
        return web.Response(text="ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self.runner.cleanup()


async def completed(client: JobsClient, queue: str, count: int) -> list[str]:
    ids = [job["id"] for job in await client.push_batch([{"type": "hook.me", "args": [n], "options": {"queue": queue}}
                                                         for n in range(count)])]
    for job in await client.fetch([queue], count=count):
        await client.ack(job["id"], {"ok": True})
    return ids


async def test_a_receiver_down_for_30_s_gets_every_event_once_it_is_back(nats_server, tmp_path):
    env = {"SEAMQ_JOBS__WEBHOOK_RETRY_DELAYS": RETRY_DELAYS, **LOCAL}
    servers = [JobServer(nats_server.url, tmp_path / f"server-{n}.log", env=env).start() for n in (1, 2)]
    receiver = Receiver()
    await receiver.start()
    try:
        async with JobsClient(servers[0].url) as client, aiohttp.ClientSession() as http:
            async with http.post(f"{servers[1].url}/ojs/v1/webhooks/subscriptions", json={
                    "url": f"http://127.0.0.1:{receiver.port}/hook", "events": ["job.completed"], "secret": SECRET,
                    "filter": {"queues": ["hooked"]}}) as answer:
                assert answer.status == 201, await answer.text()
                subscription = (await answer.json())["subscription"]
                assert "secret" not in subscription  # the client's own: never said back
            before = await completed(client, "hooked", 10)
            await completed(client, "not-hooked", 5)  # filtered out
            for _ in range(600):  # a liveness bound only
                if len(receiver.got) >= 10:
                    break
                await asyncio.sleep(0.05)
            await receiver.stop()
            during = await completed(client, "hooked", 10)
            await asyncio.sleep(DOWN_FOR)
            await receiver.start()
            for _ in range(1200):
                if len({g["event"]["subject"] for g in receiver.got}) >= 20:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(2)  # room for a duplicate to show
            subjects = [g["event"]["subject"] for g in receiver.got]
            assert sorted(subjects) == sorted(before + during), "every completed job of the queue, each once"
            assert len({g["delivery"] for g in receiver.got}) == len(receiver.got) == 20
            assert all(g["signed"] for g in receiver.got) and {g["event"]["type"] for g in receiver.got} == {"job.completed"}
            async with http.get(f"{servers[0].url}/ojs/v1/webhooks/subscriptions/{subscription['id']}/deliveries") as answer:
                records = (await answer.json())["deliveries"]
            assert len(records) == 20 and all(r["state"] == "delivered" for r in records)
            late = [r for r in records if r["attempt"] > 1]
            assert len(late) == 10, [r["attempt"] for r in records]  # the downtime's, tried again until it ended
            assert all(a["status_code"] is None and a["error"] for r in late for a in r["attempts"][:-1])
            assert all(r["attempts"][-1]["status_code"] == 200 for r in records)
    finally:
        if receiver.runner is not None:
            await receiver.runner.cleanup()
        for server in servers:
            server.stop()


async def test_a_receiver_that_refuses_a_delivery_makes_it_dead_at_once_and_recorded(nats_server, tmp_path):
    """A 4xx other than 429 is not asked again (the spec): one attempt, recorded dead with its status."""
    server = JobServer(nats_server.url, tmp_path / "server.log", env={"SEAMQ_JOBS__WEBHOOK_RETRY_DELAYS": RETRY_DELAYS,
                                                                                **LOCAL}).start()
    refused: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        refused.append(request.headers["X-OJS-Delivery-ID"])
        return web.Response(status=410, text="gone")
    app = web.Application()
    app.router.add_post("/hook", refuse)
    runner, port = web.AppRunner(app), free_port()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with JobsClient(server.url) as client, aiohttp.ClientSession() as http:
            async with http.post(f"{server.url}/ojs/v1/webhooks/subscriptions", json={
                    "url": f"http://127.0.0.1:{port}/hook", "events": ["job.*"]}) as answer:
                made = await answer.json()
                assert made["subscription"]["secret"].startswith("whsec_")  # made here: said once
            async with http.get(f"{server.url}/ojs/v1/webhooks/subscriptions/{made['id']}") as answer:
                assert "secret" not in (await answer.json())["subscription"]
            await completed(client, "refused", 1)
            for _ in range(600):  # a liveness bound only
                async with http.get(f"{server.url}/ojs/v1/webhooks/subscriptions/{made['id']}/deliveries") as answer:
                    records = (await answer.json())["deliveries"]
                if len(records) == 3 and all(r["state"] == "dead" for r in records):  # enqueued, started, completed
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(4)  # past a retry's delay: none comes
            assert sorted(r["event_type"] for r in records) == ["job.completed", "job.enqueued", "job.started"]
            assert all(r["state"] == "dead" and r["attempts"][-1]["status_code"] == 410 for r in records)
            assert sorted(refused) == sorted(r["delivery_id"] for r in records), "each tried once"
    finally:
        await runner.cleanup()
        server.stop()


def signed_with(secret: str, got: dict) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), f"{got['timestamp']}.".encode() + got["body"], hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(given, expected) for given in got["signature"].split(","))


async def test_a_ping_says_what_the_receiver_answered_and_a_rotated_secret_signs_beside_the_old_one(nats_server, tmp_path):
    servers = [JobServer(nats_server.url, tmp_path / f"server-{n}.log", env=LOCAL).start() for n in (1, 2)]
    got: list[dict] = []

    async def hook(request: web.Request) -> web.Response:
        got.append({"body": await request.read(), "timestamp": request.headers["X-OJS-Timestamp"],
                    "signature": request.headers["X-OJS-Signature"]})
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner, port = web.AppRunner(app), free_port()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with JobsClient(servers[0].url) as client, aiohttp.ClientSession() as http:
            base = [f"{s.url}/ojs/v1/webhooks/subscriptions" for s in servers]
            async with http.post(base[0], json={"url": f"http://127.0.0.1:{port}/hook", "events": ["job.completed"],
                                                "secret": SECRET, "filter": {"queues": ["rotated"]}}) as answer:
                sub = (await answer.json())["subscription"]["id"]
            async with http.post(f"{base[1]}/{sub}/test") as answer:
                pinged = await answer.json()
            assert answer.status == 200 and pinged["success"] is True and pinged["status_code"] == 200, pinged
            assert json.loads(got[0]["body"])["type"] == "webhook.test" and signed_with(SECRET, got[0])
            async with http.post(f"{base[1]}/{sub}/rotate-secret", json={}) as answer:
                rotated = await answer.json()
            new = rotated["secret"]
            assert answer.status == 200 and new != SECRET and len(new) >= 16
            async with http.get(f"{base[0]}/{sub}") as answer:
                assert new not in await answer.text() and SECRET not in await answer.text()
            await completed(client, "rotated", 1)
            for _ in range(600):  # a liveness bound only
                if len(got) >= 2:
                    break
                await asyncio.sleep(0.05)
            delivered = got[1]
            assert len(delivered["signature"].split(",")) == 2
            assert signed_with(new, delivered) and signed_with(SECRET, delivered)  # either secret verifies
            assert not signed_with("whsec_someone_else_entirely", delivered)
            await runner.cleanup()  # the receiver is gone: a ping says so
            async with http.post(f"{base[0]}/{sub}/test") as answer:
                failed = await answer.json()
            assert failed["success"] is False and failed["status_code"] is None and failed["error"]
    finally:
        await runner.cleanup()
        for server in servers:
            server.stop()
    logs = "".join((tmp_path / f"server-{n}.log").read_text() for n in (1, 2))
    assert new not in logs and SECRET not in logs


async def test_by_default_no_delivery_reaches_into_the_servers_own_network(nats_server, tmp_path):
    """A subscription's URL is anyone's to choose: loopback, private and link-local addresses (a cloud's
    metadata service) are refused unless SEAMQ_JOBS__WEBHOOK_PRIVATE_ADDRESSES allows them."""
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    receiver = Receiver()
    await receiver.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"{server.url}/ojs/v1/webhooks/subscriptions"
            for url in (f"http://127.0.0.1:{receiver.port}/hook", f"http://localhost:{receiver.port}/hook",
                        "http://169.254.169.254/latest/meta-data/", "http://[::1]:9/hook", "http://10.0.0.7/hook"):
                async with http.post(base, json={"url": url, "events": ["job.completed"], "secret": SECRET}) as answer:
                    sub = (await answer.json())["subscription"]["id"]
                async with http.post(f"{base}/{sub}/test") as answer:
                    pinged = await answer.json()
                assert pinged["success"] is False and pinged["status_code"] is None, (url, pinged)
                assert pinged["error"].startswith("refused:") and "inside this network" in pinged["error"], pinged
    finally:
        await receiver.stop()
        server.stop()
    assert receiver.got == []


async def test_a_fetch_of_events_that_runs_out_of_time_is_no_events_not_a_failure():
    """nats-py's fetch raises asyncio's TimeoutError, not its own, when its time runs out between its
    no-wait pull and the lingering one (nats/js/client.py): the fan-out logged that as a failed step
    and paused a second (seen by a user's run of `seamq jobs serve`)."""
    from seamq.jobs.nats_hooks import NatsHooks

    class OutOfTime:
        async def fetch(self, most: int, timeout: float) -> list:
            raise asyncio.TimeoutError

    assert await NatsHooks._fetch(OutOfTime(), 10, 1.0) == []
