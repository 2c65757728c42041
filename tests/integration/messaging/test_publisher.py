"""The publishing layer says whether a failure is the broker's (unreachable: the relay waits) or the
message's (it backs off alone): by exception type and ack, never by matching error text."""

from __future__ import annotations

import nats

from seamq.nats.publisher import PipelinedPublisher
from seamq.ports import OutMessage


async def test_no_stream_is_the_messages_fault_and_a_closed_connection_the_brokers(nats_server):
    nc = await nats.connect(nats_server.url)
    publisher = await PipelinedPublisher(nc, timeout=2).start()
    [nowhere] = await publisher.publish_many([OutMessage("no.stream.here", b"{}", {})])
    assert not nowhere.ok and not nowhere.transport and "503" in nowhere.error
    await nc.close()
    [closed] = await publisher.publish_many([OutMessage("no.stream.here", b"{}", {})])
    assert not closed.ok and closed.transport, closed.error


async def test_an_ack_that_never_comes_is_the_brokers(nats_server):
    nc = await nats.connect(nats_server.url)
    publisher = await PipelinedPublisher(nc, timeout=0.5).start()
    nats_server.kill()  # the client reconnects in the background; the publish waits for an ack in vain
    [lost] = await publisher.publish_many([OutMessage("sea.event.a.v1", b"{}", {})])
    assert not lost.ok and lost.transport, lost.error
    await nc.close()
