"""seamq.nats.gaps against a real nats-server: deliveries sent and never received are named, under the
consumer's filter, and nothing is named when nothing was lost (a reconnect that lost nothing, or
processes sharing a durable consumer, whose deliveries leave gaps in each other's sequence)."""

from __future__ import annotations

import json

from nats.js.api import AckPolicy, ConsumerConfig

from seamq.nats import jsapi
from seamq.nats.connect import connect
from seamq.nats.partitions import GROUP
from seamq.nats.pull import PullSource
from seamq.settings import NatsSettings

from helpers import wait_for


async def _stream(nc, *, filter_subject: str = "gaps.a.>") -> None:
    js = nc.jetstream()
    await js.add_stream(name="GAPS", subjects=["gaps.>"])
    await js.add_consumer("GAPS", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
                                                 filter_subject=filter_subject))


def _into(taken: list):
    async def take(msg) -> None:
        taken.append(msg)
    return take


async def _pending(nc) -> int:
    return (await nc.jetstream().consumer_info("GAPS", "c")).num_ack_pending


async def test_deliveries_lost_with_the_connection_are_named_after_the_reconnect(nats_server):
    nc = await connect(NatsSettings(url=nats_server.url), name="gaps")
    try:
        await _stream(nc)
        js = nc.jetstream()
        seqs = {}  # ours (gaps.a.*) among others the filter leaves out
        for i in range(12):
            ack = await js.publish(f"gaps.{'a' if i % 3 else 'b'}.{i}", b"x")
            if i % 3:
                seqs[i] = ack.seq
        pull = await PullSource(nc, "GAPS", "c", buffer=1, gaps=True).start()
        [first] = await pull.fetch(1, 5)  # and it asks for the next one, which comes
        await wait_for(lambda: pull.buffered == 1, timeout=10, what="the second delivery")
        # Two deliveries that never reach the pull: what was in flight when its connection was cut
        # (the server sends only where someone listens; this one listens and drops them).
        away, dropped = await connect(NatsSettings(url=nats_server.url), name="gaps-void"), []
        await away.subscribe("_void.here", cb=_into(dropped))
        await away.publish("$JS.API.CONSUMER.MSG.NEXT.GAPS.c", json.dumps({"batch": 2}).encode(), reply="_void.here")
        await wait_for(lambda: len(dropped) == 2, timeout=10, what="two deliveries sent where nobody takes them")
        assert await _pending(nc) == 4
        await away.close()
        await nc.force_reconnect()
        await wait_for(lambda: nc.stats["reconnects"] == 1, timeout=10, what="a reconnect")
        got = [first] + await pull.fetch(1, 5) + await pull.fetch(1, 5)
        assert [m.seq for m in got] == [seqs[1], seqs[2], seqs[7]]
        assert [(m.seq, m.subject) for m in pull.missed()] == [(seqs[4], "gaps.a.4"), (seqs[5], "gaps.a.5")]
        assert pull.missed() == [], "each is named once"

        await wait_for(lambda: pull.buffered == 1, timeout=10, what="the next delivery")
        await nc.force_reconnect()  # this time nothing is in flight
        await wait_for(lambda: nc.stats["reconnects"] == 2, timeout=10, what="a reconnect")
        more = await pull.fetch(1, 5)
        assert [m.seq for m in more] == [seqs[8]] and pull.missed() == []
        assert pull.gaps.lookups == 1
        await pull.close()
    finally:
        await nc.close()


async def test_lost_deliveries_sent_again_out_of_order_are_named_at_the_gap_and_none_twice(nats_server):
    """The server sends what it must send again before anything new, and not always in stream order
    (here: three lost ones given back newest first). The gap shows at the first of them, and every
    lost one is named there, before it is handed on, so that each aggregate already waits for the
    others; none of them is named again once it came."""
    nc = await connect(NatsSettings(url=nats_server.url), name="gaps")
    away, dropped = await connect(NatsSettings(url=nats_server.url), name="gaps-void"), []
    try:
        await _stream(nc)
        js = nc.jetstream()
        seqs = [(await js.publish(f"gaps.a.{i}", b"x")).seq for i in range(8)]
        pull = await PullSource(nc, "GAPS", "c", buffer=1, gaps=True, alone=True).start()
        [first] = await pull.fetch(1, 5)
        await first.ack()
        await wait_for(lambda: pull.buffered == 1, timeout=10, what="the second delivery")
        await away.subscribe("_void.here", cb=_into(dropped))
        await away.publish("$JS.API.CONSUMER.MSG.NEXT.GAPS.c", json.dumps({"batch": 3}).encode(), reply="_void.here")
        await wait_for(lambda: len(dropped) == 3, timeout=10, what="three deliveries sent where nobody takes them")
        for msg in reversed(dropped):  # back to the server newest first: it sends them again in that order
            await msg.nak()
        await away.flush()
        [second] = await pull.fetch(1, 5)
        await second.ack()
        [again] = await pull.fetch(1, 10)
        assert (again.delivered, again.seq) == (2, seqs[4])
        assert [m.seq for m in pull.missed()] == seqs[2:4], "the other lost ones named at the gap"
        rest = [again]
        while len(rest) < 6:
            rest += await pull.fetch(1, 10)
        assert [m.seq for m in rest] == [seqs[4], seqs[3], seqs[2], *seqs[5:]]
        assert pull.missed() == [] and pull.gaps.lookups == 1, "what came back is not named again"
        for msg in rest:
            await msg.ack()
        await pull.close()
    finally:
        await away.close()
        await nc.close()


async def test_processes_sharing_a_consumer_name_nothing_without_a_fault(nats_server):
    nc = await connect(NatsSettings(url=nats_server.url), name="gaps")
    try:
        await _stream(nc, filter_subject="gaps.>")
        js = nc.jetstream()
        for i in range(600):
            await js.publish(f"gaps.a.{i}", b"x")
        pulls = [await PullSource(nc, "GAPS", "c", buffer=20, gaps=True).start() for _ in range(2)]
        got = [0, 0]
        while sum(got) < 600:
            for i, pull in enumerate(pulls):
                for msg in await pull.fetch(10, 0.2):
                    await msg.ack()
                    got[i] += 1
        assert min(got) > 0, "both took a share: each saw gaps in the delivery sequence"
        assert [p.gaps.lookups for p in pulls] == [0, 0] and [p.missed() for p in pulls] == [[], []]
        for pull in pulls:
            await pull.close()
    finally:
        await nc.close()


async def test_alone_on_its_consumer_every_gap_is_a_loss_with_no_fault_seen(nats_server):
    """A route that stalls drops deliveries with no fault the client sees. A process alone on its
    consumer (consumer.alone) names them at the next fresh delivery; one that may share it does not
    (the gap could be another process's)."""
    nc = await connect(NatsSettings(url=nats_server.url), name="gaps")
    try:
        await _stream(nc)
        js = nc.jetstream()
        seqs = [(await js.publish(f"gaps.a.{i}", b"x")).seq for i in range(20)]
        pulls = {alone: await PullSource(nc, "GAPS", "c", buffer=1, gaps=True, alone=alone).start()
                 for alone in (True, False)}
        for alone, pull in pulls.items():
            [got] = await pull.fetch(1, 5)
            await got.ack()
            await wait_for(lambda pull=pull: pull.buffered == 1, timeout=10, what="the next delivery")
            await (await pull.fetch(1, 5))[0].ack()  # and the one after it is on its way to us
            await wait_for(lambda pull=pull: pull.buffered == 1, timeout=10, what="the next delivery")
            away, dropped = await connect(NatsSettings(url=nats_server.url), name="gaps-void"), []
            await away.subscribe("_void.here", cb=_into(dropped))
            await away.publish("$JS.API.CONSUMER.MSG.NEXT.GAPS.c", json.dumps({"batch": 1}).encode(),
                               reply="_void.here")
            await wait_for(lambda dropped=dropped: dropped, timeout=10, what="a delivery sent where nobody takes it")
            await away.close()
            await (await pull.fetch(1, 5))[0].ack()
            [after] = await pull.fetch(1, 5)
            await after.ack()
            named = [m.seq for m in pull.missed()]
            if alone:
                assert named == [after.seq - 1] and named[0] in seqs, named
            else:
                assert named == [], "a process that may share its consumer takes no gap for a loss"
            await pull.close()
    finally:
        await nc.close()


async def test_a_pinned_pull_takes_every_gap_under_its_pin_for_a_loss_and_none_across_a_new_pin(nats_server):
    """A partition's pull, while pinned, is the only one its messages go to: a delivery dropped on the
    way with no fault seen is named at the next fresh one. When the pin moves to another process and
    back, what that one was sent meanwhile is no gap of ours."""
    nc = await connect(NatsSettings(url=nats_server.url), name="gaps")
    away = await connect(NatsSettings(url=nats_server.url), name="gaps-void")
    try:
        await nc.jetstream().add_stream(name="GAPS", subjects=["gaps.>"])
        await jsapi.call(nc, "CONSUMER.CREATE.GAPS.p", {"stream_name": "GAPS", "config": {
            "durable_name": "p", "ack_policy": "explicit", "ack_wait": 30_000_000_000, "priority_groups": [GROUP],
            "priority_policy": "pinned_client", "priority_timeout": 5_000_000_000}})
        for i in range(30):
            await nc.jetstream().publish(f"gaps.a.{i}", b"x")
        pull = await PullSource(nc, "GAPS", "p", buffer=1, group=GROUP, gaps=True, alone=True).start()
        for _ in range(2):
            await (await pull.fetch(1, 5))[0].ack()
            await wait_for(lambda: pull.buffered == 1, timeout=10, what="the next delivery")
        dropped = []
        await away.subscribe("_void.here", cb=_into(dropped))
        await away.publish("$JS.API.CONSUMER.MSG.NEXT.GAPS.p", json.dumps(
            {"batch": 1, "group": GROUP, "id": pull.pin}).encode(), reply="_void.here")  # under our pin
        await wait_for(lambda: dropped, timeout=10, what="a delivery sent under our pin where nobody takes it")
        await (await pull.fetch(1, 5))[0].ack()
        [after] = await pull.fetch(1, 5)
        await after.ack()
        assert [m.seq for m in pull.missed()] == [after.seq - 1] and pull.gaps.lookups == 1

        # The pin moves to another process, which takes three; ours is let go as a partition gives one
        # back (seamq.nats.partitions: no stale pin on its next requests, so no 423 either).
        first_pin, pull.paused, pull.pin = pull.pin, True, None
        await wait_for(lambda: pull.buffered == 1, timeout=10, what="the next delivery")
        await pull.take()[0].ack()
        assert pull.idle
        await jsapi.call(nc, "CONSUMER.UNPIN.GAPS.p", {"group": GROUP})
        theirs = []
        await away.subscribe("_theirs.here", cb=_into(theirs))
        await away.publish("$JS.API.CONSUMER.MSG.NEXT.GAPS.p", json.dumps({"batch": 3, "group": GROUP}).encode(),
                           reply="_theirs.here")
        await wait_for(lambda: len(theirs) == 3, timeout=10, what="the other process's three")
        for msg in theirs:
            await msg.ack()
        await away.flush()
        await jsapi.call(nc, "CONSUMER.UNPIN.GAPS.p", {"group": GROUP})
        pull.paused = False
        for _ in range(3):
            await (await pull.fetch(1, 5))[0].ack()
        assert pull.pin != first_pin and pull.gaps.lookups == 1 and pull.missed() == []
        await pull.close()
    finally:
        await away.close()
        await nc.close()
