"""seamq.nats.wire writes what nats-py's publish would, with its guarantees, or these tests fail.

The layer uses nats-py's private connection API; the first test is the tripwire for its shape."""

from __future__ import annotations

import asyncio
import inspect
import random

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from seamq.nats.wire import Wire, header_block


def test_the_private_api_the_wire_uses_is_still_there():
    assert list(inspect.signature(Client._send_command).parameters) == ["self", "cmd", "priority"]
    assert list(inspect.signature(Client._flush_pending).parameters) == ["self", "force_flush"]
    client = Client()
    for name in ("_max_pending_size", "_pending_data_size", "_max_payload", "_flush_queue", "stats"):
        assert hasattr(client, name), name
    assert {"out_msgs", "out_bytes"} <= set(client.stats)


def _nats_py_block(headers: dict) -> bytes:
    """The header block nats-py's publish puts on the wire, captured from its _send_command."""
    client = Client()
    sent = []

    async def capture(cmd, priority=False):
        sent.append(cmd)

    client._send_command = capture
    client._flush_queue = None
    asyncio.run(client._send_publish("s", "", b"", 0, headers))
    line, rest = sent[0].split(b"\r\n", 1)
    return rest[:int(line.split()[-2])]


def test_header_blocks_match_nats_py_on_hostile_headers():
    rng = random.Random(3)
    alphabet = "aZ09-_ :\r\n\t\x00é€\u2028 "
    cases = [{}, {"Nats-Msg-Id": "x"}, {" padded ": " v "}, {"": "dropped"}, {"K": "a\r\nInjected: 1"},
             {"K": "\u00a0nbsp\u00a0"}, {"K": ""}, {"Nats-Msg-Id": "1", "traceparent": "00-" + "a" * 32}]
    for _ in range(3000):
        cases.append({"".join(rng.choice("aZ09-_!#") for _ in range(rng.randint(1, 8))):
                      "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
                      for _ in range(rng.randint(0, 5))})
    for headers in cases:
        assert header_block(headers) == _nats_py_block(headers), headers
    for bad in ({"a b": "1"}, {"a:b": "1"}, {"é": "1"}):
        with pytest.raises(nats.errors.BadHeaderError):
            header_block(bad)
        with pytest.raises(nats.errors.BadHeaderError):
            _nats_py_block(bad)


async def test_a_wire_message_arrives_as_nats_pys_would(nats_server):
    nc = await nats.connect(nats_server.url)
    got = []

    async def seen(msg):
        got.append((msg.subject, msg.reply, msg.headers, msg.data))

    await nc.subscribe("w.>", cb=seen)
    headers = {"Nats-Msg-Id": "m1", "Seamq-Aggregate-Id": " o-1\r\n"}
    await nc.publish("w.a", b"payload", reply="r.1", headers=headers)
    await Wire(nc).publish("w.a", b"payload", reply="r.1", headers=header_block(headers))
    await nc.publish("w.b", b"")
    await Wire(nc).publish("w.b", b"")
    await nc.flush()
    await asyncio.sleep(0.1)
    assert got[0] == got[1] and got[2] == got[3] and len(got) == 4
    assert nc.stats["out_msgs"] >= 4
    await nc.close()


async def test_the_wire_keeps_nats_pys_guarantees(nats_server):
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1,
                            pending_size=64 * 1024)
    wire = Wire(nc)
    with pytest.raises(nats.errors.MaxPayloadError):
        await wire.publish("w.big", b"x" * (nc.max_payload + 1))
    for subject in ("", "w a", "w.\r\nPUB x 1"):
        with pytest.raises(nats.errors.BadSubjectError):
            await wire.publish(subject, b"")
    with pytest.raises(nats.errors.BadSubjectError):
        await wire.publish("w.a", b"", reply="r 1")
    nats_server.stop()
    await asyncio.sleep(0.3)  # reconnecting
    await wire.publish("w.buffered", b"x" * 1000)  # within the pending buffer: kept for the reconnect
    with pytest.raises(nats.errors.OutboundBufferLimitError):
        await wire.publish("w.buffered", b"x" * 65 * 1024)
    nats_server.start()
    got = []

    async def seen(msg):
        got.append(msg.subject)

    for _ in range(100):
        if nc.is_connected:
            break
        await asyncio.sleep(0.1)
    await nc.subscribe("w.after", cb=seen)
    await wire.publish("w.after", b"1")
    await nc.flush()
    await asyncio.sleep(0.1)
    assert got == ["w.after"]
    await nc.drain()  # flushes what the wire wrote, as for nats-py's publish
    with pytest.raises(nats.errors.ConnectionClosedError):
        await wire.publish("w.a", b"")
