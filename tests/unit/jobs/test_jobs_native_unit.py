"""seamq.jobs.native's client, on a stand-in engine: an ack or a nack that meets NATS away is said
again, and a refusal is not (the server's answer, as the HTTP client raises it)."""

from __future__ import annotations

from types import SimpleNamespace

import nats.errors
import pytest
from structlog.testing import capture_logs

from seamq.jobs import native
from seamq.jobs.client import JobsError
from seamq.jobs.model import OjsError


class Ops:
    """The engine's ack and nack, failing with the given errors first."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures, self.calls = list(failures), []

    async def ack(self, job_id, result=None, *, may_wait=0.0):
        return self._answer("ack", job_id, may_wait)

    async def nack(self, job_id, error=None, requeue=False, *, may_wait=0.0):
        return self._answer("nack", job_id, may_wait)

    def _answer(self, what: str, job_id: str, may_wait: float) -> dict:
        self.calls.append((what, job_id, may_wait))
        if self.failures:
            raise self.failures.pop(0)
        return {"id": job_id}


async def test_an_ack_met_by_nats_away_is_said_again_and_may_wait_for_the_next_fetch():
    ops = Ops(nats.errors.TimeoutError(), nats.errors.NoRespondersError())
    with capture_logs() as logs:
        assert await native.EngineClient(SimpleNamespace(ops=ops)).ack("j1", {"ok": True}, may_wait=0.05) == {"id": "j1"}
    assert ops.calls == [("ack", "j1", 0.05)] * 3
    assert [(e["event"], e["job_id"], e["attempt"]) for e in logs] == [("job_settle_retrying", "j1", 1),
                                                                       ("job_settle_retrying", "j1", 2)]


async def test_a_refused_nack_is_not_said_again():
    ops = Ops(OjsError(409, "conflict", "cannot fail job j2: it is completed"))
    with pytest.raises(JobsError) as refused:
        await native.EngineClient(SimpleNamespace(ops=ops)).nack("j2", ValueError("boom"))
    assert refused.value.status == 409 and len(ops.calls) == 1


async def test_nats_away_for_longer_than_the_tries_is_said(monkeypatch):
    monkeypatch.setattr(native, "SETTLE_TRIES", 3)
    ops = Ops(*[nats.errors.TimeoutError()] * 4)
    with pytest.raises(nats.errors.TimeoutError):
        await native.EngineClient(SimpleNamespace(ops=ops)).ack("j3")
    assert len(ops.calls) == 3


async def test_a_worker_tells_an_ack_said_together_that_was_refused_and_waits_for_the_rest_as_it_stops():
    """A client whose acks go together (`ack_soon`, the engine in the worker's process): the worker
    counts them as on their way, logs a refusal as it logs one of `ack`, and stops once all are heard."""
    import asyncio

    from seamq.jobs.worker import Worker, WorkerConfig

    class Together:
        def __init__(self) -> None:
            self.fetched, self.said = False, []

        async def fetch(self, queues, **kwargs):
            if self.fetched:
                return []
            self.fetched = True
            return [{"id": "j1", "type": "t", "args": []}, {"id": "j2", "type": "t", "args": []}]

        def ack_soon(self, job_id, result=None):
            future = asyncio.get_running_loop().create_future()
            self.said.append((job_id, future))
            return future

        async def beat(self, *args, **kwargs):
            return {}

    client = Together()

    async def quick() -> str:
        return "ok"

    worker = Worker(client, quick, WorkerConfig(queues=("q",), concurrency=2, idle_wait=0.01))
    running = asyncio.create_task(worker.run())
    while len(client.said) < 2:
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.sleep(0.05)
    assert not running.done() and len(worker.settling) == 2  # it waits for what it said
    with capture_logs() as logs:
        client.said[0][1].set_exception(JobsError(409, "conflict", "cannot acknowledge job j1: it is cancelled"))
        client.said[1][1].set_result({"id": "j2", "state": "completed"})
        await asyncio.wait_for(running, 5)  # a liveness bound only
    assert [(e["event"], e["job_id"]) for e in logs if e["event"].startswith("job_settle")] == [("job_settle_refused", "j1")]
    assert not worker.settling


async def test_acks_said_together_that_met_nats_away_are_said_again_alone_and_the_rest_told_at_once(monkeypatch):
    """One round of `ack_soon`: an ack NATS did not answer goes through `ack` (its tries), a refusal is
    the HTTP client's JobsError, and a stored one is told without waiting for the others."""
    import asyncio

    async def round_of(ops, said, *, may_wait):
        return [nats.errors.TimeoutError(), OjsError(409, "conflict", "it is cancelled"), {"id": said[2][0]}]

    monkeypatch.setattr(native.completions, "acks", round_of)
    ops = Ops(nats.errors.TimeoutError())  # the ack said again meets NATS away once more, then is stored
    client = native.EngineClient(SimpleNamespace(ops=ops))
    away, refused, stored = (client.ack_soon(job_id) for job_id in ("j1", "j2", "j3"))
    assert await stored == {"id": "j3"} and not away.done()
    with pytest.raises(JobsError) as told:
        await refused
    assert told.value.status == 409
    assert await asyncio.wait_for(away, 10) == {"id": "j1"}  # a liveness bound only
    assert [call[:2] for call in ops.calls] == [("ack", "j1")] * 2


def test_jobs_are_fetched_ahead_only_while_the_slots_turn_over_within_ahead():
    """`fetched_ahead`: as many as ended in the last AHEAD seconds once that is every slot's worth, at most
    FETCHES fetches' worth; a job whose slot frees slower than that is fetched for a free slot alone."""
    from seamq.jobs.worker import AHEAD, FETCHES, fetched_ahead

    now = 100.0
    assert fetched_ahead([now - 0.001 * n for n in range(3)], now, 4) == 0  # fewer than the slots
    assert fetched_ahead([now - 0.001 * n for n in range(6)], now, 4) == 6
    assert fetched_ahead([now - 0.001 * n for n in range(40)], now, 4) == 4 * FETCHES
    assert fetched_ahead([now - AHEAD - 0.001 * n for n in range(40)], now, 4) == 0  # ended too long ago


async def test_short_jobs_are_fetched_ahead_two_fetches_at_once_and_a_stop_runs_what_was_fetched(monkeypatch):
    """Jobs that end at once free their slots faster than a fetch comes back: the worker keeps two
    fetches on their way and more jobs than slots fetched, never more running than its slots; told to
    stop, it fetches nothing more and runs what it had fetched before it goes (none is released unrun)."""
    import asyncio

    from seamq.jobs import worker as module
    from seamq.jobs.worker import Worker, WorkerConfig

    monkeypatch.setattr(module, "AHEAD", 60.0)  # every end counts as recent: what is fetched is decided by counts

    class Server:
        def __init__(self) -> None:
            self.handed, self.acked, self.nacked, self.fetching, self.most = 0, [], [], 0, {"fetching": 0, "held": 0}

        async def fetch(self, queues, *, count, worker_id, visibility_timeout_ms, tenant=None):
            self.fetching += 1
            self.most["fetching"] = max(self.most["fetching"], self.fetching)
            await asyncio.sleep(0.005)  # the server's answer takes a while
            self.fetching -= 1
            jobs = [{"id": f"j{self.handed + n}", "type": "t", "args": []} for n in range(count)]
            self.handed += count
            self.most["held"] = max(self.most["held"], self.handed - len(self.acked))
            return jobs

        async def ack(self, job_id, result=None, *, may_wait=0.0):
            self.acked.append(job_id)

        async def nack(self, job_id, error, *, requeue=False, may_wait=0.0):
            self.nacked.append(job_id)

        async def heartbeat(self, *args, **kwargs):
            return {"state": "running", "jobs_cancelled": []}

        async def beat(self, *args, **kwargs):
            return {}

    server, running, most_running = Server(), [0], [0]

    async def quick() -> None:
        running[0] += 1
        most_running[0] = max(most_running[0], running[0])
        await asyncio.sleep(0)
        running[0] -= 1

    worker = Worker(server, quick, WorkerConfig(queues=("q",), concurrency=4, idle_wait=0.01))
    task = asyncio.create_task(worker.run())
    while len(server.acked) < 200:
        await asyncio.sleep(0.005)
    worker.stop()
    await asyncio.wait_for(task, 30)  # a liveness bound only
    assert server.most["fetching"] == 2 and 4 < server.most["held"] <= 4 * 3 and most_running[0] <= 4
    assert sorted(server.acked) == sorted(f"j{n}" for n in range(server.handed)) and server.nacked == []


async def test_a_job_fetched_ahead_that_the_server_cancels_meanwhile_is_never_started(monkeypatch):
    """A heartbeat names the jobs fetched ahead too (their leases run from their claim), and one the
    server says was cancelled is dropped before it starts; the rest run as slots free."""
    import asyncio

    from seamq.jobs import worker as module
    from seamq.jobs.worker import Worker, WorkerConfig

    monkeypatch.setattr(module, "AHEAD", 60.0)
    release, ran, named = asyncio.Event(), [], []

    class Server:
        queue = [[{"id": "quick", "type": "t", "args": ["quick"]}], [{"id": "long", "type": "t", "args": ["long"]}],
                 [{"id": "gone", "type": "t", "args": ["gone"]}, {"id": "next", "type": "t", "args": ["next"]}]]

        async def fetch(self, queues, **kwargs):
            return self.queue.pop(0) if self.queue else []

        async def ack(self, job_id, result=None, *, may_wait=0.0):
            return {}

        async def heartbeat(self, worker_id, active_jobs, *, visibility_timeout_ms):
            named.append(list(active_jobs))
            return {"state": "running", "jobs_cancelled": ["gone"] if "gone" in active_jobs else []}

        async def beat(self, *args, **kwargs):
            return {}

    async def function(name: str) -> None:
        ran.append(name)
        if name == "long":
            await release.wait()

    worker = Worker(Server(), function, WorkerConfig(queues=("q",), concurrency=1, idle_wait=0.01, visibility_timeout=2))
    task = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + 60  # liveness bounds only
    while not any("gone" in said for said in named) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    release.set()
    while "next" not in ran and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert ran == ["quick", "long", "next"] and ["long", "gone", "next"] in named
