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


async def test_a_key_stops_at_its_first_message_not_stored_and_other_keys_go_on(nats_server):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="KEYS", subjects=["keys.>"])
    publisher = await PipelinedPublisher(nc, timeout=2).start()
    a, b = ("order", "a"), ("order", "b")
    sent = [OutMessage("keys.a", b"a0", {}, key=a), OutMessage("keys.b", b"b0", {}, key=b),
            OutMessage("no.stream.here", b"a1", {}, key=a), OutMessage("keys.a", b"a2", {}, key=a),
            OutMessage("keys.b", b"b1", {}, key=b), OutMessage("keys.none", b"n", {})]
    results = await publisher.publish_many(sent)
    assert [r.ok for r in results] == [True, True, False, False, True, True]
    assert "503" in results[2].error and results[3].held and not results[3].transport
    stored = [(await js.get_msg("KEYS", seq)).data for seq in range(1, 5)]
    assert sorted(stored) == [b"a0", b"b0", b"b1", b"n"]  # a2 waits for a1: never stored before it
    assert stored.index(b"b0") < stored.index(b"b1")
    await nc.close()


async def test_a_broker_gone_mid_key_holds_the_rest(nats_server):
    nc = await nats.connect(nats_server.url)
    publisher = await PipelinedPublisher(nc, timeout=2).start()
    nats_server.kill()
    key = ("order", "a")
    results = await publisher.publish_many([OutMessage("sea.event.a.v1", b"{}", {}, key=key)] * 3)
    assert results[0].transport and all(r.held for r in results[1:])
    await nc.close()


async def test_no_wave_goes_out_after_one_the_broker_left_unanswered(nats_server):
    # b0 reaches a subscriber that never answers, as a stream leader lost mid-claim does: a timeout, the
    # broker's fault. a0 was stored, but a1 waits for the next claim rather than risk a second timeout.
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="KEYS", subjects=["keys.>"])
    await nc.subscribe("silent.>")
    publisher = await PipelinedPublisher(nc, timeout=1).start()
    a, b = ("order", "a"), ("order", "b")
    results = await publisher.publish_many([OutMessage("keys.a", b"a0", {}, key=a),
                                            OutMessage("silent.b", b"b0", {}, key=b),
                                            OutMessage("keys.a", b"a1", {}, key=a)])
    assert results[0].ok and results[1].transport and results[2].held
    assert (await js.stream_info("KEYS")).state.messages == 1
    await nc.close()
