"""JetStream fast batch publishing against a real nats-server: which results say stored, failed or held."""

from __future__ import annotations

import nats
import pytest

from seamq.nats.fast_batch import FastBatchPublisher, batched_streams, server_batches
from seamq.nats.publisher import PipelinedPublisher
from seamq.ports import OutMessage

from helpers import freeze, read_stream, wait_for


@pytest.fixture
async def publisher(nats_server):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="FB", subjects=["fb.>"], allow_batched=True)
    await js.add_stream(name="PLAIN", subjects=["plain.>"])
    fallback = await PipelinedPublisher(nc, timeout=2).start()
    batched = await batched_streams(nc, ["FB", "PLAIN", "MISSING"])
    publisher = await FastBatchPublisher(nc, batched, fallback, timeout=2, flow=10, window=2).start()
    yield publisher, nc
    await publisher.close()
    await fallback.close()
    await nc.close()


def _msg(subject: str, msg_id: str, stream: str | None = "FB", payload: bytes = b"{}") -> OutMessage:
    return OutMessage(subject, payload, {"Nats-Msg-Id": msg_id}, stream)


async def test_streams_that_allow_batches_are_chosen_at_connect(publisher):
    publisher, nc = publisher
    assert server_batches(nc)
    assert publisher.batched == {"FB"}


async def test_a_long_batch_under_flow_control_with_duplicates_is_all_stored_once(publisher):
    publisher, nc = publisher
    await publisher.publish_many([_msg("fb.a", f"m{i}") for i in range(0, 300, 3)])  # every third, before
    messages = [_msg("fb.a", f"m{i}") for i in range(1000)] + [_msg("fb.a", "m5")]  # and one twice
    results = await publisher.publish_many(messages)
    assert all(r.ok for r in results) and len(results) == 1001  # a duplicate counts as stored
    stored = [m.headers["Nats-Msg-Id"] for m in await read_stream(nc.jetstream(), "FB")]
    assert sorted(stored) == sorted({f"m{i}" for i in range(1000)}) and len(stored) == 1000


async def test_a_message_no_stream_takes_ends_the_batch_before_it(publisher):
    publisher, nc = publisher
    messages = [_msg("fb.a", "a1"), _msg("fb.a", "a2"), _msg("nowhere.x", "x"), _msg("fb.a", "a3")]
    ok1, ok2, failed, held = await publisher.publish_many(messages)
    assert ok1.ok and ok2.ok
    assert not failed.ok and not failed.transport and not failed.held and "503" in failed.error
    assert held.held and not held.ok
    assert [m.headers["Nats-Msg-Id"] for m in await read_stream(nc.jetstream(), "FB")] == ["a1", "a2"]


async def test_a_message_too_big_to_send_ends_the_batch_before_it(publisher):
    publisher, nc = publisher
    big = _msg("fb.a", "big", payload=b"x" * (nc.max_payload + 1))
    results = await publisher.publish_many([_msg("fb.a", "b1"), big, _msg("fb.a", "b2")])
    assert results[0].ok and not results[1].ok and "MaxPayload" in results[1].error and results[2].held
    assert [m.headers["Nats-Msg-Id"] for m in await read_stream(nc.jetstream(), "FB")] == ["b1"]


async def test_streams_without_batches_are_pipelined_in_the_same_call(publisher):
    publisher, nc = publisher
    results = await publisher.publish_many([_msg("fb.a", "f1"), _msg("plain.a", "p1", "PLAIN"),
                                            _msg("plain.b", "p2", None), _msg("fb.a", "f2")])
    assert [r.ok for r in results] == [True] * 4
    assert results[1].seq == 1 and results[2].seq == 2  # pipelined acks say where
    assert results[0].seq == results[3].seq == 2  # a fast batch says "at or before" its last one


async def test_a_stream_that_turns_batches_off_goes_back_to_pipelining(publisher):
    publisher, nc = publisher
    js = nc.jetstream()
    config = (await js.stream_info("FB")).config
    config.allow_batched = False
    await js.update_stream(config)
    results = await publisher.publish_many([_msg("fb.a", f"d{i}") for i in range(5)])
    assert all(r.ok for r in results) and publisher.batched == set()
    assert len(await read_stream(js, "FB")) == 5


async def test_a_server_that_goes_away_mid_batch_is_the_brokers_fault(publisher, nats_server):
    publisher, nc = publisher
    nats_server.kill()
    results = await publisher.publish_many([_msg("fb.a", f"k{i}") for i in range(50)])
    assert not any(r.ok for r in results)
    first = next(r for r in results if not r.held)
    assert first.transport, first.error
    nats_server.start()
    await wait_for(lambda: nc.is_connected, what="the client back")


async def test_flow_acks_without_a_final_answer_count_for_nothing(publisher, nats_server):
    """A stream leader cut off from its peers flow-acks what it cannot replicate, then says nothing
    more: the partitions lab lost 294 events that way, marked published on those acks. Here the
    server stops answering (SIGSTOP) after acking part of a batch: no result says stored, and
    publishing them again stores each once (their Msg-Ids)."""
    import asyncio
    import signal

    publisher, nc = publisher
    messages = [_msg("fb.a", f"s{i}") for i in range(200)]
    sending = asyncio.create_task(publisher.publish_many(messages))
    await wait_for(lambda: any(b.acked for b in publisher._open.values()), timeout=10, interval=0.001,
                   what="a flow ack")
    freeze(nats_server.proc.pid)
    try:
        results = await sending
    finally:
        nats_server.proc.send_signal(signal.SIGCONT)
    assert not any(r.ok for r in results) and results[0].transport, results[0]
    await wait_for(lambda: nc.is_connected, timeout=30, what="the client back")
    again = await publisher.publish_many(messages)
    assert all(r.ok for r in again)
    stored = [m.headers["Nats-Msg-Id"] for m in await read_stream(nc.jetstream(), "FB")]
    assert sorted(stored) == sorted(m.headers["Nats-Msg-Id"] for m in messages)


async def test_a_batch_sent_again_to_a_leader_that_cannot_replicate_is_not_said_stored(nats_cluster):
    """A stream leader cut off from its peers proposes what it is sent and cannot commit it. A batch
    sent again after the timeout is all duplicates of those proposals, which nats-server counts as
    stored and answers with a final ack: the partitions lab lost 15 events that way (marked published,
    gone once a new leader took over). No result may say stored until a new leader has the messages."""
    import os
    import signal

    probe = await nats.connect(servers=nats_cluster.url.split(","))
    await probe.jetstream().add_stream(name="FB3", subjects=["fb3.>"], allow_batched=True, num_replicas=3)
    leader = (await probe.jetstream().stream_info("FB3")).cluster.leader
    assert await batched_streams(probe, ["FB3"]) == set(), "a replicated stream is published message by message"
    await probe.close()
    node = nats_cluster.node(leader)
    followers = [n for n in nats_cluster.nodes if n is not node]
    nc = await nats.connect(node.url, max_reconnect_attempts=0)
    fallback = await PipelinedPublisher(nc, timeout=1).start()
    publisher = await FastBatchPublisher(nc, {"FB3"}, fallback, timeout=1.5).start()
    messages = [_msg("fb3.a", f"p{i}", stream="FB3") for i in range(15)]
    for follower in followers:  # the leader alone: it proposes, and nothing commits
        freeze(follower.proc.pid)
    try:
        first = await publisher.publish_many(messages)
        again = await publisher.publish_many(messages)  # the relay's next claim, before the leader steps down
    finally:
        await publisher.close()
        await fallback.close()
        await nc.close()
        node.kill()  # the leader goes; the others elect one without its proposals
        for follower in followers:
            os.kill(follower.proc.pid, signal.SIGCONT)
    assert not any(r.ok for r in first), first[0]
    assert not any(r.ok for r in again), [r for r in again if r.ok][:1]
    other = await nats.connect(servers=[f.url for f in followers])
    try:
        await wait_for(lambda: _has_leader(other), timeout=60, what="a new stream leader")
        ours = await PipelinedPublisher(other, timeout=5).start()
        assert all(r.ok for r in await ours.publish_many(messages))  # stored once, by the new leader
        await ours.close()
        stored = [m.headers["Nats-Msg-Id"] for m in await read_stream(other.jetstream(), "FB3")]
        assert sorted(stored) == sorted(m.headers["Nats-Msg-Id"] for m in messages)
    finally:
        await other.close()
        node.start()


async def _has_leader(nc) -> bool:
    try:
        return bool((await nc.jetstream().stream_info("FB3")).cluster.leader)
    except Exception:
        return False
