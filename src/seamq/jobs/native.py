"""`seamq jobs worker --nats`: the worker's calls answered by a job engine in its own process.

Over HTTP each job costs a fetch's share and an ack request, parsed and answered by a job server on
the same cores; here the worker (seamq.jobs.worker, the same code) calls the server's own engine
(seamq.jobs.engine) on the same NATS. So every rule, lease, heartbeat and timer is the server's,
and this worker runs beside `seamq jobs serve` instances and the SDKs' workers on the same queues.
Its claims leave their counts to the job's next change (seamq.jobs.recounts), so a claim is one
plain compare-and-set, not an atomic batch: its acks and failures, which the worker does not wait on
and lets wait a little (seamq.jobs.worker.ACK_WAIT), then share one batch, many rounds of short jobs
in it (seamq.jobs.tallied), and a job still running after recounts.COUNTED_AFTER is counted as active.
An ack or a nack that meets NATS away (a node lost, an election) is said again a few times, as the
HTTP client says one again over a lost connection; one stored meanwhile is then refused, and
the worker logs that. A refusal is the JobsError the HTTP client raises for the same answer.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable

import nats.errors
import nats.js.errors

from seamq.backoff import Backoff
from seamq.jobs import beats, completions, ext, tenants
from seamq.jobs.client import JobsError, error_body
from seamq.jobs.engine import Engine, collect_less
from seamq.jobs.handlers import JobHandlers
from seamq.jobs.model import OjsError
from seamq.jobs.nats_store import NatsJobStore
from seamq.jobs.worker import ACK_WAIT, Worker, WorkerConfig, run_until_signalled
from seamq.nats.connect import connect
from seamq.nats.publisher import UNREACHABLE
from seamq.model import describe
from seamq.observability import log
from seamq.redact import redact
from seamq.settings import Settings

SETTLE_TRIES = 6  # an ack or a nack tried while NATS is away, 3 to 6 s in all
SETTLE_BACKOFF = Backoff(0.2, 3.2)  # the house's retry delay: doubling from 0.2 s, with jitter
AWAY = (*UNREACHABLE, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)


async def started_engine(nc: Any, *, replicas: int | None = None) -> Engine:
    """An engine for a worker's own process: its claims, and the jobs its timers make available, leave
    their counts to a recount (seamq.jobs.recounts); its acks go many to a batch (seamq.jobs.completions)."""
    return await Engine(await NatsJobStore(nc, replicas=replicas).start(), count_claims_later=True).start()


class EngineClient:
    """The calls a worker makes of a job server (seamq.jobs.client.JobsClient's), made of an engine. An
    ack or a nack answers the job's record as stored (the worker reads nothing of it), not the HTTP answer."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._tasks: set[asyncio.Task] = set()  # rounds of acks on their way
        self._acks: list[tuple[str, Any, asyncio.Future]] = []  # said in this turn of the loop

    async def fetch(self, queues: list[str], *, count: int = 1, worker_id: str | None = None,
                    visibility_timeout_ms: int | None = None, tenant: str | None = None) -> list[dict]:
        return await _asked(self.engine.ops.fetch, queues, count, worker_id, visibility_timeout_ms,
                            None if tenant is None else tenants.given(tenant))

    def ack_soon(self, job_id: str, result: Any = None) -> asyncio.Future:
        """An ack the worker does not wait on, settled as `ack` is: the acks said in one turn of the loop
        go to the engine together (seamq.jobs.completions), with no task each."""
        future = asyncio.get_running_loop().create_future()
        self._acks.append((job_id, result, future))
        if len(self._acks) == 1:
            asyncio.get_running_loop().call_soon(self._send_acks)
        return future

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, []
        self._spawn(self._acked(acks))

    async def _acked(self, acks: list[tuple[str, Any, asyncio.Future]]) -> None:
        said = [(job_id, result) for job_id, result, _ in acks]
        try:
            outcomes = await completions.acks(self.engine.ops, said, may_wait=ACK_WAIT)
        except Exception as exc:  # each is told, and said again if NATS was away
            outcomes = [exc] * len(acks)
        again = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, AWAY)]
        for (_, _, future), outcome in zip(acks, outcomes):
            if not isinstance(outcome, AWAY):
                _tell(future, outcome=outcome)
        answers = await asyncio.gather(*(self.ack(*said[n], may_wait=ACK_WAIT) for n in again),  # as `ack` says one
                                       return_exceptions=True)
        for n, answer in zip(again, answers):
            _tell(acks[n][2], outcome=answer)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def ack(self, job_id: str, result: Any = None, *, may_wait: float = 0.0) -> dict:
        return await _settled(functools.partial(self.engine.ops.ack, may_wait=may_wait), job_id, result)

    async def nack(self, job_id: str, error: BaseException | dict | str, *, requeue: bool = False,
                   may_wait: float = 0.0) -> dict:
        return await _settled(functools.partial(self.engine.ops.nack, may_wait=may_wait), job_id,
                              error_body(error), requeue)

    async def beat(self, worker_id: str, state: str, active_jobs: int) -> dict:
        return await _asked(beats.beat, self.engine.ops, worker_id, state, active_jobs)

    async def save_checkpoint(self, job_id: str, state: Any, *, worker_id: str | None = None) -> dict:
        return await _asked(ext.save_checkpoint, self.engine.ops, self.engine.events, job_id,
                            {"state": state, "worker_id": worker_id})

    async def delete_checkpoint(self, job_id: str) -> dict:
        return await _asked(ext.delete_checkpoint, self.engine.ops, job_id)

    async def heartbeat(self, worker_id: str, active_jobs: list[str], *,
                        visibility_timeout_ms: int | None = None) -> dict:
        return await _asked(beats.heartbeat, self.engine.ops, worker_id, active_jobs, visibility_timeout_ms)


def _tell(future: asyncio.Future, *, outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(_refusal(outcome) if isinstance(outcome, OjsError) else outcome)
    else:
        future.set_result(outcome)


def _refusal(exc: OjsError) -> JobsError:
    """The JobsError the HTTP client raises for the same answer."""
    return JobsError(exc.status, exc.code, exc.message, exc.details)


async def _settled(call: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    for attempt in range(1, SETTLE_TRIES + 1):
        try:
            return await _asked(call, *args)
        except AWAY as exc:
            if attempt == SETTLE_TRIES:
                raise
            log.warning("job_settle_retrying", job_id=args[0], attempt=attempt, error=describe(exc))
            await asyncio.sleep(SETTLE_BACKOFF.delay(attempt))
    raise AssertionError("unreachable")


async def _asked(call: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    try:
        return await call(*args)
    except OjsError as exc:
        raise _refusal(exc) from None


async def run_native_worker(settings: Settings, handler: JobHandlers | Callable, config: WorkerConfig) -> None:
    """The CLI's entry: an engine on NATS (SEAMQ_NATS__*), and a worker over it until SIGTERM or SIGINT."""
    nc = await connect(settings.nats, name="seamq-jobs-worker")
    try:
        engine = await started_engine(nc, replicas=settings.jobs.replicas)
        collect_less()
        try:
            await run_until_signalled(Worker(EngineClient(engine), handler, config),
                                      via=f"engine on {redact(settings.nats.url)}")
        finally:
            await engine.stop()
    finally:
        await nc.close()
