"""A NATS outage in a worker's log: said once when it starts, reminded at a slowing interval, and
said when it ends (issue 44: the relay, consumer, job server and console each logged `nats_error`
every 0.5 s, the console twice as often)."""

from __future__ import annotations

import asyncio
import time

from structlog.testing import capture_logs

from seamq.nats.connect import Outage, connect
from seamq.settings import NatsSettings

from helpers import wait_for


async def test_an_outage_is_logged_once_then_reminded_less_often_and_its_end_said(nats_server):
    with capture_logs() as logs:
        nc = await connect(NatsSettings(url=nats_server.url), name="seamq-test-outage")
        try:
            nats_server.stop()
            await wait_for(lambda: any(e["event"] == "nats_unavailable" for e in logs), what="the outage said")
            started = time.monotonic()
            while time.monotonic() - started < 3.0:  # six or more failed reconnects, at 0.5 s each
                await asyncio.sleep(0.1)
            nats_server.start()
            await wait_for(lambda: nc.is_connected, timeout=30, what="reconnected")
            await wait_for(lambda: any(e["event"] == "nats_reconnected" for e in logs), what="its end said")
        finally:
            await nc.close()
    events = [e["event"] for e in logs if e["event"].startswith("nats_")]
    assert events.count("nats_unavailable") == 1 and events.count("nats_reconnected") == 1, events
    assert events.count("nats_error") == 0, events  # no line per failed attempt
    assert events.count("nats_still_unavailable") <= 1, events  # the first reminder comes after 5 s


async def test_the_reminders_slow_down_to_one_every_five_minutes():
    clock = [0.0]
    outage = Outage("seamq-test", clock=lambda: clock[0])  # this test's clock, moved by hand
    with capture_logs() as logs:
        for second in range(0, 3600):  # an hour of failed reconnects, two a second
            clock[0] = float(second)
            await outage.error(ConnectionRefusedError("refused"))
            clock[0] = second + 0.5
            await outage.error(ConnectionRefusedError("refused"))
        await outage.reconnected()
    said = [(e["event"], e.get("seconds")) for e in logs]
    reminders = [s for event, s in said if event == "nats_still_unavailable"]
    assert said[0][0] == "nats_unavailable" and said[-1] == ("nats_reconnected", 3599.5), said[-3:]
    assert reminders[:5] == [5, 15, 35, 75, 155], reminders  # 5, 10, 20, 40, 80 s apart
    assert all(b - a <= 300 for a, b in zip(reminders, reminders[1:])) and len(reminders) < 20, reminders
