"""Where seamq reads what nats-py would read, faster: same answers, or the test fails."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from urllib.parse import urlparse

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.transport import TcpTransport

from helpers import wait_for

from seamq.nats import pull
from seamq.nats.connect import CLOSE_WAIT, NATS_PARSE_HEADER_LINES, NATS_WAIT_CLOSED, parse_header_lines
from seamq.nats.pull import JsDelivery, ack_fields


def test_header_parsing_matches_nats_py_on_hostile_input():
    assert Client._parse_header_lines is not NATS_PARSE_HEADER_LINES  # ours is the one in use
    assert list(inspect.signature(NATS_PARSE_HEADER_LINES).parameters) == ["raw"]  # nats-py's shape
    cases = [
        b"", b"\r\n", b"A: 1\r\n", b"A:1\r\nB:\t2 \r\n", b"Nats-Msg-Id: x\r\nNats-Msg-Id: y\r\n",
        b"a b: 1\r\nc\x1cd: 2\r\n e : 3\r\n", b": empty name\r\n", b"no colon\r\n", b"K: v: w\r\n",
        b"\xff\xfe: bad name\r\nok: \xff bad value\r\n", b"K: \xe2\x82\xac\r\n", b"K:\r\nL:    \r\n",
        b"A: 1\nB: 2\r\n", b"\x00: nul\r\n\tT: tab\r\n",
    ]
    rng = random.Random(7)
    alphabet = b"ab :\r\n\t\x0b\x1c\xff\xc3\xa9-_"
    cases += [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(5000)]
    for raw in cases:
        assert parse_header_lines(raw) == NATS_PARSE_HEADER_LINES(raw), raw


async def test_ack_fields_match_nats_py_metadata(nc):
    js = nc.jetstream()
    await js.add_stream(name="EDGES", subjects=["edges.>"])
    for i in range(3):
        await js.publish(f"edges.{i}", b"x")
    sub = await js.pull_subscribe("edges.>", durable="edges")
    msgs = await sub.fetch(3, timeout=5)
    await msgs[1].nak()
    msgs += await sub.fetch(1, timeout=5)  # a redelivery: delivered 2
    v2 = Msg(nc, subject="s", reply="$JS.ACK.hub.ACCHASH.ORDERS.c1.3.41.17.1700000000000000000.5.rnd")
    for msg in [*msgs, v2]:
        meta = msg.metadata
        assert ack_fields(msg) == (meta.stream, meta.num_delivered, meta.sequence.stream, meta.sequence.consumer,
                                  meta.num_pending)
    assert JsDelivery(msgs[-1]).delivered == 2


async def test_a_pull_that_reaches_no_consumer_is_asked_again_not_waited_out(nc, monkeypatch):
    """A 503 (no responders) ends the request: during a consumer leader's election the pull must not stall
    until its expiry. EXPIRES is made long so that only the server's answer can end the request."""
    monkeypatch.setattr(pull, "EXPIRES", 60.0)
    js = nc.jetstream()
    await js.add_stream(name="NOLEADER", subjects=["noleader.>"])
    source = await pull.PullSource(nc, "NOLEADER", "late", buffer=10).start()
    try:
        assert await source.fetch(10, timeout=0.2) == []  # the consumer does not exist yet
        await wait_for(lambda: source.idle, timeout=10, what="the 503 to end the pull request")
        await js.add_consumer("NOLEADER", durable_name="late", ack_policy="explicit")
        await js.publish("noleader.1", b"x")
        assert [m.data for m in await source.fetch(10, timeout=10)] == [b"x"]
    finally:
        await source.close()


async def test_deliveries_after_a_time_no_consumer_leader_answered_say_they_resumed(nc):
    """While no consumer leader answers (an election: no responders), a NAK or a redelivery the last
    leader had may be lost, and comes back within ack_wait of a leader delivering again: the source
    says when that was (`resumed()`), as after a reconnect, so that held aggregates wait that long
    again (seamq.holds). Deliveries from a leader that always answered say nothing."""
    js = nc.jetstream()
    await js.add_stream(name="RESUMED", subjects=["resumed.>"])
    source = await pull.PullSource(nc, "RESUMED", "late", buffer=10).start()
    try:
        assert await source.fetch(10, timeout=0.2) == []  # no consumer yet: no responders
        await wait_for(lambda: source.idle, timeout=10, what="the 503 to end the pull request")
        assert source.resumed() is None, "nothing delivered yet"
        await js.add_consumer("RESUMED", durable_name="late", ack_policy="explicit")
        before = time.monotonic()
        await js.publish("resumed.1", b"x")
        assert [m.data for m in await source.fetch(10, timeout=10)] == [b"x"]
        at = source.resumed()
        assert at is not None and at >= before
        await js.publish("resumed.2", b"y")
        assert [m.data for m in await source.fetch(10, timeout=10)] == [b"y"]
        assert source.resumed() is None, "a leader that answered all along"
    finally:
        await source.close()


async def test_a_connection_whose_server_reads_nothing_more_is_dropped_when_closed_not_waited_on():
    """What a server cut off by the network looks like from here: the connection holds what it could
    not send, and nats-py waits for it to close before it tries another server. The wait is bounded
    (seamq.nats.connect.wait_closed_or_drop); nats-py's own waits for as long as the peer lives."""
    assert inspect.getsource(NATS_WAIT_CLOSED).strip().endswith("return await self._io_writer.wait_closed()")
    accepted = []
    server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)  # reads nothing
    port = server.sockets[0].getsockname()[1]
    transport = TcpTransport()
    await transport.connect(urlparse(f"nats://127.0.0.1:{port}"), 32768, 5)
    transport.write(b"x" * 64 * 1024 * 1024)  # more than the kernel's buffers take
    started = time.monotonic()
    transport.close()
    await asyncio.wait_for(transport.wait_closed(), 60)
    assert time.monotonic() - started >= CLOSE_WAIT * 0.9  # it waited its bound for the data to go
    server.close()
    for writer in accepted:
        writer.close()


def test_after_a_loss_every_other_server_is_tried_before_the_one_lost_the_least_tried_first():
    from nats.aio.client import Server

    from seamq.nats.connect import Rotation

    a, b, c = (Server(urlparse(f"nats://10.0.0.{n}:4222")) for n in (1, 2, 3))
    rotation = Rotation()
    rotation.on = a.uri.netloc  # the one lost
    for _ in range(20):  # whatever the tie-break draws
        choice, delay = rotation([a, b, c], {})
        assert choice in (b, c) and delay == 0
    b.reconnects = 1  # tried, failed
    assert rotation([a, b, c], {}) == (c, 0)
    c.reconnects = 1  # every other failed: any of the three, the lost one too
    assert {rotation([a, b, c], {})[0].uri.netloc for _ in range(50)} == {s.uri.netloc for s in (a, b, c)}
    assert rotation([b, c], {})[1] > 0  # a server tried and failed is tried again after a pause
