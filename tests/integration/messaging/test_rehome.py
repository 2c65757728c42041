"""seamq.nats.rehome: a relay whose server cannot serve JetStream moves to another server; one on a
server that can stays. Real nats-servers; the publisher inside is a stand-in that fails as a broker
cut off would (the port, not NATS, is faked)."""

from __future__ import annotations

import subprocess

from structlog.testing import capture_logs

from seamq.embedded.nats_server import nats_server_binary
from seamq.embedded.process import _wait_for_port, free_port
from seamq.model import PubResult
from seamq.nats.connect import connect
from seamq.nats.rehome import Rehoming
from seamq.settings import NatsSettings

from helpers import wait_for


class TimedOut:
    """Every publish times out, as to a stream leader split from its peers."""

    async def publish_many(self, messages):
        return [PubResult(ok=False, error="TimeoutError", transport=True) for _ in messages]

    async def close(self) -> None:
        pass


async def test_a_server_in_its_cluster_keeps_the_relay(nats_server):
    nc = await connect(NatsSettings(url=nats_server.url), name="seamq-relay")
    try:
        with capture_logs() as logs:
            assert await Rehoming(TimedOut(), nc).publish_many([object()]) != []
        assert nc.stats["reconnects"] == 0 and not [e for e in logs if e["event"] == "nats_server_cut_off"]
    finally:
        await nc.close()


async def test_a_server_that_cannot_serve_jetstream_is_left(tmp_path):
    port = free_port()
    log = tmp_path / "plain.log"
    with open(log, "wb") as out:  # no JetStream: what a server cut off from its cluster's is to a client
        server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)], stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, server, "nats-server", log)
        nc = await connect(NatsSettings(url=f"nats://127.0.0.1:{port}"), name="seamq-relay")
        try:
            with capture_logs() as logs:
                await Rehoming(TimedOut(), nc).publish_many([object()])
            await wait_for(lambda: nc.stats["reconnects"] == 1, timeout=30, what="a move to another server")
            [said] = [e for e in logs if e["event"] == "nats_server_cut_off"]
            assert said["action"] == "moving to another server" and said["error"]
        finally:
            await nc.close()
    finally:
        server.kill()
        server.wait()
