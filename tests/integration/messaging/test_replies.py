"""seamq.nats.replies on a real nats-server: each answer reaches the request it answers, a request
with no answer times out, and an answer that comes too late, or a message of someone else's on the
inbox, reaches no one (it must never pass for the answer to a later request)."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from seamq.nats.replies import Replies, acked

from helpers import wait_for


@pytest.fixture
async def replies(nc):
    made = await Replies(nc, timeout=0.6).start()
    yield made
    await made.close()


async def responder(nc, subject: str, answer, delay: float = 0.0):
    async def respond(message):
        await asyncio.sleep(delay)
        for data, headers in answer(message):
            await nc.publish(message.reply, data, headers=headers)
    return await nc.subscribe(subject, cb=respond)


async def test_each_answer_reaches_its_request(nc, replies):
    await responder(nc, "echo", lambda m: [(b"re:" + m.data, None)])
    answers = await asyncio.gather(*(replies.request("echo", str(n).encode()) for n in range(200)))
    assert [a.data for a in answers] == [f"re:{n}".encode() for n in range(200)]


async def test_no_answer_times_out_and_a_late_one_reaches_no_one(nc, replies):
    await responder(nc, "slow", lambda m: [(b"late " + m.data, None)], delay=1.0)
    await responder(nc, "fast", lambda m: [(b"on time " + m.data, None)])
    started = asyncio.get_running_loop().time()
    with pytest.raises(nats.errors.TimeoutError):
        await replies.request("slow", b"1")
    assert 0.5 < asyncio.get_running_loop().time() - started < 1.0
    later = asyncio.create_task(replies.request("fast", b"2"))
    await asyncio.sleep(0.6)  # the slow answer comes meanwhile, to an inbox no one waits on
    assert (await later).data == b"on time 2" and not replies._waiting


async def test_a_run_of_answers_ends_at_its_status(nc, replies):
    def many(message):
        return [*((str(n).encode(), None) for n in range(5)), (b"", {"Status": "204"})]
    await responder(nc, "many", many)
    got = [m.data async for m in replies.answers("many", b"", ends=("204",))]
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    with pytest.raises(nats.js.errors.APIError):  # a status it was not told ends a run is an error
        [m async for m in replies.answers("many", b"", ends=("404",))]


async def test_a_stranger_on_the_inbox_is_no_answer(nc, replies):
    await responder(nc, "quiet", lambda m: [])
    waiting = asyncio.create_task(replies.request("quiet", b""))
    await asyncio.sleep(0.05)
    await nc.publish(replies._prefix + "not-a-number", b"x")
    await nc.publish(replies._prefix + "999999", b"y")
    with pytest.raises(nats.errors.TimeoutError):
        await waiting


async def test_a_publish_ack_is_read_and_no_stream_is_said(nc, replies):
    js = nc.jetstream()
    await js.add_stream(name="ACKS", subjects=["acks.>"])
    assert acked(await replies.request("acks.one", b"x"))["seq"] == 1
    with pytest.raises(nats.errors.NoRespondersError):
        acked(await replies.request("nobody.listens", b"x"))


async def test_a_request_may_wait_longer_or_shorter_than_the_default(nc, replies):
    """A longer wait asked first does not hold back a shorter one asked after it (the default is 0.6 s)."""
    held = []

    async def hold(message):
        held.append(message)

    async def ignore(message):
        pass

    await nc.subscribe("held", cb=hold)
    await nc.subscribe("silent", cb=ignore)
    asked = asyncio.get_running_loop().time()
    patient = asyncio.create_task(replies.request("held", b"1", timeout=60.0))
    await wait_for(lambda: held, what="the long request asked first")
    with pytest.raises(nats.errors.TimeoutError):  # swept at its own deadline, not after the long one's
        await asyncio.wait_for(replies.request("silent", b"2", timeout=0.3), 30)
    await asyncio.sleep(max(0.0, asked + 1.0 - asyncio.get_running_loop().time()))  # past the default
    assert not patient.done()
    await nc.publish(held[0].reply, b"late 1")
    assert (await patient).data == b"late 1"  # past the default, within its own


async def test_at_most_in_flight_requests_wait_for_an_answer_and_the_rest_wait_their_turn(nc):
    """A burst bigger than the bound is sent as answers free turns: none is timed out by its own queue."""
    replies = await Replies(nc, timeout=5, in_flight=4).start()
    unanswered, most = [], [0]

    async def hold(message):
        unanswered.append(message)
        most[0] = max(most[0], len(unanswered))

    await nc.subscribe("held", cb=hold)

    async def answer_all():
        while True:
            await asyncio.sleep(0.01)
            while unanswered:
                message = unanswered.pop(0)
                await nc.publish(message.reply, b"ok:" + message.data)

    answering = asyncio.create_task(answer_all())
    try:
        answers = await asyncio.gather(*(replies.request("held", str(n).encode()) for n in range(40)))
    finally:
        answering.cancel()
        await replies.close()
    assert sorted(a.data for a in answers) == sorted(f"ok:{n}".encode() for n in range(40))
    assert most[0] <= 4


async def test_requests_sent_together_are_each_answered_and_a_turn_comes_back_however_its_request_ends(nc):
    """`sent` (a fetch's claims): requests go out at once and are awaited together. A turn comes back when
    the answer comes, when the time is up, and when the asker went away before either."""
    replies = await Replies(nc, timeout=0.3, in_flight=2).start()
    await responder(nc, "echo", lambda m: [(b"re:" + m.data, None)])
    await responder(nc, "silent", lambda m: [])
    try:
        for turn in range(3):  # more requests in all than turns: each turn came back with its answer
            sent = [await replies.sent("echo", f"{turn}.{n}".encode()) for n in range(2)]
            assert [m.data for m in await asyncio.gather(*sent)] == [f"re:{turn}.{n}".encode() for n in range(2)]
        unanswered = [await replies.sent("silent", b"") for _ in range(2)]
        for future in unanswered:
            with pytest.raises(nats.errors.TimeoutError):
                await future
        gone = [asyncio.create_task(replies.request("silent", b"")) for _ in range(2)]  # both turns taken
        await wait_for(lambda: len(replies._waiting) == 2, what="both asked")
        for task in gone:
            task.cancel()
        answer = await asyncio.wait_for(replies.request("echo", b"last"), 30)  # once their time was up
        assert answer.data == b"re:last" and not replies._waiting
    finally:
        await replies.close()
