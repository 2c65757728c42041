"""`seamq jobs worker`: run OJS jobs through plain Python functions, by job type (seamq.jobs.handlers).

The worker runs up to `concurrency` jobs at a time (short ones fetched a little
ahead of their slots: AHEAD), calls the job type's
function with the job's args (a type it has no function for fails its attempt
with `UnknownJobType`, retried by the job's policy), heartbeats while jobs run
(so a long job keeps its lease), acks
with the return value, and nacks with the exception (its class is the error
type that `retry.non_retryable_errors` matches). A sync function runs in a
thread.

A job cancelled on the server is named in a heartbeat's `jobs_cancelled`: that
job alone is stopped (an async one; a thread runs on, and its ack is refused).
Stopping (SIGTERM, SIGINT, or a `terminate` heartbeat directive) fetches
nothing more and lets running jobs finish for `grace` seconds; an async job
still running then is cancelled and released (nack with requeue) so another
worker takes it at once, instead of after its lease. A sync function's thread
cannot be stopped, so its job is never released while it runs: the worker
keeps its lease (heartbeats) and settles it when it ends; otherwise another
worker would run the job while this thread still does. A worker killed outright loses nothing
either: its jobs come back when their visibility timeout (`--visibility-timeout`,
60 s by default, kept alive by heartbeats) runs out.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import aiohttp

from seamq.jobs import sealing
from seamq.jobs.client import JobsClient, JobsError
from seamq.jobs.durable import Checkpoint
from seamq.jobs.handlers import JobHandlers, UnknownJobType
from seamq.jobs.sealing import Keys
from seamq.model import ErrorCode, SeamqError, describe
from seamq.observability import log
from seamq.redact import redact
from seamq.stopping import wait_event

STARTUP_WAIT = 5.0  # seconds the job server may take to answer a starting worker
SAY_WAIT = 2.0  # seconds a stopping worker gives the server to hear that it drains, then that it ends
# An ack or a nack, which the worker does not wait on, may wait this long to share the store's batch
# with others (a seamq server, or the engine of `--nats`): one batch then holds many rounds of short jobs.
ACK_WAIT = 0.05
# Acks and nacks on their way, in slots' worth, before the worker stops fetching. Acks wait ACK_WAIT by
# design, so a fast worker has its rate times that on their way (200 at 4,000 jobs/s): at 16 slots'
# worth that bound, not the work, held a native worker at 16 at once back (docs/benchmarks.md 7r).
SETTLES_AHEAD = 64
# Short jobs free their slots faster than a fetch comes back: the worker then fetches ahead of them, with
# FETCHES on their way at once (one is read and claimed while the server answers the other), but only
# while its slots turn over within AHEAD seconds, so that a job fetched ahead waits about that for a slot
# (`fetched_ahead`; docs/benchmarks.md 7s). Longer jobs are fetched for free slots alone.
AHEAD = 0.05
FETCHES = 2
STOPPED = {"code": "worker_stopped", "message": "the worker stopped before the job finished"}


@dataclass(frozen=True)
class WorkerConfig:
    queues: tuple[str, ...]
    concurrency: int = 10
    visibility_timeout: float = 60.0  # seconds a fetched job stays leased without a heartbeat
    grace: float = 25.0  # seconds running jobs get to finish after a stop
    idle_wait: float = 0.2  # seconds between fetches when the queues are empty
    worker_id: str = ""
    tenant: str | None = None  # one tenant's jobs alone (seamq.jobs.tenants); None: every tenant's, in turn
    keys: Keys | None = None  # to open the args of jobs sealed by their clients (seamq.jobs.sealing)

    @property
    def heartbeat_every(self) -> float:
        return max(0.5, self.visibility_timeout / 4)


class Worker:
    def __init__(self, client: JobsClient | Any, handlers: JobHandlers | Callable, config: WorkerConfig) -> None:
        """`client`: a JobsClient over HTTP, or seamq.jobs.native's engine in this process (the same calls)."""
        self.client, self.handlers, self.config = client, JobHandlers.of(handlers), config
        self.worker_id = config.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.stopping = asyncio.Event()
        self.quiet = False  # told by the server (an operator, through the admin API): fetch nothing more
        self.running: dict[str, asyncio.Task] = {}
        # Acks and nacks on their way, which nobody waits on: a slot is free once its function returns.
        # Each may wait ACK_WAIT to share a batch, so many rounds of short jobs fill one.
        self.settling: set[asyncio.Future] = set()
        self.cancelled: set[str] = set()  # by the server: nothing to release
        self.in_threads: set[str] = set()  # jobs whose sync function runs in a thread: cannot be cancelled
        self.ahead: deque[dict] = deque()  # fetched ahead of the slots, waiting for one
        self._fetching: dict[asyncio.Task, int] = {}  # fetches on their way, and the jobs each asked
        self._ended: deque[float] = deque(maxlen=config.concurrency * FETCHES)  # when the last jobs ended
        self._idle_until = 0.0  # a fetch found nothing: the next waits idle_wait
        self._grace_ends = math.inf  # set by stop()
        self._slot = asyncio.Event()

    def stop(self) -> None:
        if not self.stopping.is_set():
            self._grace_ends = time.monotonic() + self.config.grace
        self.stopping.set()
        self._slot.set()

    async def run(self) -> None:
        """Until stopped: fetch, run, settle; then drain or release what still runs."""
        beat = asyncio.create_task(self._heartbeats())
        try:
            # Stopping, what was fetched still runs within the grace: its jobs were claimed for this worker.
            while not self.stopping.is_set() or (self.ahead or self._fetching) and self._grace_left() > 0:
                while self.ahead and len(self.running) < self.config.concurrency:
                    job = self.ahead.popleft()
                    self.running[job["id"]] = asyncio.create_task(self._run(job))
                self._fetch_more()
                self._slot.clear()
                idle = self._idle_until - asyncio.get_running_loop().time()
                await wait_event(self._slot, self._grace_left() if self.stopping.is_set() else
                                 idle if idle > 0 and not self._fetching else None)
            await self._drain()
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)

    def _grace_left(self) -> float:
        return self.config.grace if self._grace_ends == math.inf else max(0.0, self._grace_ends - time.monotonic())

    def _fetch_more(self) -> None:
        """Fetches for the free slots and, for short jobs, ahead of them (AHEAD); none while quiet, while
        acks on their way hold fetching back (SETTLES_AHEAD), or within idle_wait of a fetch that found nothing."""
        now, concurrency = asyncio.get_running_loop().time(), self.config.concurrency
        if self.quiet or self.stopping.is_set() or now < self._idle_until:
            return
        beyond = max(0, len(self.settling) - concurrency * SETTLES_AHEAD)
        ahead = 0 if beyond else fetched_ahead(self._ended, now, concurrency)
        room = concurrency + ahead - beyond - len(self.running) - len(self.ahead) - sum(self._fetching.values())
        while room > 0 and len(self._fetching) < FETCHES:
            count = min(room, concurrency)
            fetch = asyncio.create_task(self._fetch(count))
            self._fetching[fetch], room = count, room - count
            fetch.add_done_callback(self._fetched)

    def _fetched(self, fetch: asyncio.Task) -> None:
        del self._fetching[fetch]
        jobs = [] if fetch.cancelled() else fetch.result()
        self.ahead.extend(jobs)
        if not jobs:
            self._idle_until = asyncio.get_running_loop().time() + self.config.idle_wait
        self._slot.set()

    async def _fetch(self, count: int) -> list[dict]:
        try:
            return await self.client.fetch(list(self.config.queues), count=count, worker_id=self.worker_id,
                                           visibility_timeout_ms=int(self.config.visibility_timeout * 1000),
                                           tenant=self.config.tenant)
        except Exception as exc:  # server away: try again shortly, never die
            log.warning("jobs_fetch_failed", error=describe(exc))
            await asyncio.sleep(1.0)
            return []

    async def _run(self, job: dict) -> None:
        try:
            try:
                handler = self.handlers.route(job["type"])
                args = sealing.opened(job, self.config.keys)  # the client's args, when it sealed them
                kwargs: dict[str, Any] = {"job": {**job, "args": args}} if handler.passes_job else {}
                if handler.passes_checkpoint:
                    kwargs["checkpoint"] = Checkpoint(self.client, job, self.worker_id)
                if not handler.in_thread:
                    result = await handler.function(*args, **kwargs)
                else:
                    self.in_threads.add(job["id"])
                    result = await asyncio.to_thread(handler.function, *args, **kwargs)
            except asyncio.CancelledError:
                if job["id"] in self.cancelled:
                    raise
                await self._settle(self.client.nack(job["id"], STOPPED, requeue=True), job, "released")
                raise
            except sealing.Unopenable as exc:  # another worker may hold the key (a rotation half done)
                log.warning("job_args_unopenable", job_id=job["id"], type=job["type"], error=str(exc))
                self._settle_later(self.client.nack(job["id"], {"code": "args_unopenable", "type": "Unopenable",
                                                                 "message": str(exc)}, may_wait=ACK_WAIT), job, "nack")
                return
            except UnknownJobType as exc:
                log.warning("job_type_unknown", job_id=job["id"], type=job["type"], error=str(exc))
                self._settle_later(self.client.nack(job["id"], {"code": "unknown_job_type", "type": "UnknownJobType",
                                                                 "message": str(exc)}, may_wait=ACK_WAIT), job, "nack")
                return
            except Exception as exc:
                log.warning("job_failed", job_id=job["id"], type=job["type"], attempt=job.get("attempt"),
                            error=describe(exc), exc_info=exc)
                self._settle_later(self.client.nack(job["id"], exc, may_wait=ACK_WAIT), job, "nack")
                return
            if hasattr(self.client, "ack_soon"):  # the engine in this process: acks said together, no task each
                self._track(self.client.ack_soon(job["id"], _jsonable(result)), job, "ack")
            else:
                self._settle_later(self.client.ack(job["id"], _jsonable(result), may_wait=ACK_WAIT), job, "ack")
        finally:
            self._ended.append(asyncio.get_running_loop().time())
            self._idle_until = 0.0  # a slot came free: fetch again now, as after a fetch that found jobs
            self.running.pop(job["id"], None)
            self.cancelled.discard(job["id"])
            self.in_threads.discard(job["id"])
            self._slot.set()

    def _settle_later(self, call, job: dict, what: str) -> None:
        task = asyncio.create_task(self._settle(call, job, what))
        self.settling.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Future) -> None:
        self.settling.discard(task)
        self._slot.set()

    def _track(self, settled: asyncio.Future, job: dict, what: str) -> None:
        """A settling the client carries on without a task of ours: told as `_settle` tells one."""
        self.settling.add(settled)
        settled.add_done_callback(lambda done: self._told(done, job, what))

    def _told(self, done: asyncio.Future, job: dict, what: str) -> None:
        self._settled(done)
        if not done.cancelled() and (exc := done.exception()) is not None:
            _said_unsettled(job, what, exc)

    async def _settle(self, call, job: dict, what: str) -> None:
        try:
            await call
        except Exception as exc:
            _said_unsettled(job, what, exc)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_every)
            if not self.running and not self.ahead:
                continue
            try:
                answer = await self.client.heartbeat(self.worker_id, [*self.running, *(j["id"] for j in self.ahead)],
                                                     visibility_timeout_ms=int(self.config.visibility_timeout * 1000))
            except Exception as exc:
                log.warning("jobs_heartbeat_failed", error=describe(exc))
                continue
            cancelled = set(answer.get("jobs_cancelled") or [])
            self.ahead = deque(job for job in self.ahead if job["id"] not in cancelled)  # not to be started
            for job_id in cancelled:  # cancelled on the server: stop that job only
                task = self.running.get(job_id)
                if task is not None and job_id not in self.in_threads:
                    log.info("job_cancelled_on_server", job_id=job_id)
                    self.cancelled.add(job_id)
                    task.cancel()
            if answer.get("state") == "quiet" and not self.quiet:
                log.info("jobs_worker_told_to_quiet", worker_id=self.worker_id)
                self.quiet = True
            if answer.get("state") == "terminate" and not answer.get("jobs_cancelled"):
                log.info("jobs_worker_told_to_stop", worker_id=self.worker_id)
                self.stop()

    async def _drain(self) -> None:
        await self._say("drain")
        await asyncio.gather(*self._fetching, return_exceptions=True)
        if self.ahead:
            log.warning("jobs_released_unstarted", jobs=[job["id"] for job in self.ahead],
                        why="fetched ahead, and the grace ran out before a slot came free: back to their queue")
        while self.ahead:
            job = self.ahead.popleft()
            self._settle_later(self.client.nack(job["id"], STOPPED, requeue=True), job, "released")
        await self._drain_running()
        await asyncio.gather(*list(self.settling), return_exceptions=True)  # every ack said before we go
        await self._say("terminate")

    async def _say(self, state: str) -> None:
        """Graceful shutdown, as the OJS spec has a worker say it: the server hands a draining worker no
        new job, and shows it draining. Said once: a server away must not hold the stop up."""
        try:
            await asyncio.wait_for(self.client.beat(self.worker_id, state, len(self.running)), SAY_WAIT)
        except Exception as exc:
            log.warning("jobs_worker_state_unsaid", state=state, error=describe(exc))

    async def _drain_running(self) -> None:
        if not self.running:
            return
        log.info("jobs_worker_draining", running=len(self.running), grace_s=self.config.grace)
        done, pending = await asyncio.wait(list(self.running.values()), timeout=self._grace_left())
        threads = [t for j, t in self.running.items() if t in pending and j in self.in_threads]
        if threads:  # heartbeats go on until the threads end: the leases stay ours
            log.warning("jobs_outlive_grace", running=[j for j, t in self.running.items() if t in threads],
                        why="a sync function's thread cannot be stopped: its job keeps its lease until it ends")
        for task in pending:  # released, not lost: another worker takes them now
            if task not in threads:
                task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def fetched_ahead(ended: Iterable[float], now: float, concurrency: int) -> int:
    """Jobs to fetch ahead of the free slots, from when the last jobs ended: while the slots turn over
    within AHEAD (as many jobs ended in the last AHEAD seconds as there are slots), as many as ended
    then, at most FETCHES fetches' worth; else none."""
    recent = sum(1 for at in ended if at > now - AHEAD)
    return min(recent, concurrency * FETCHES) if recent >= concurrency else 0


def _said_unsettled(job: dict, what: str, exc: BaseException) -> None:
    if isinstance(exc, JobsError):  # the job moved on without us (lease ran out, cancelled): say so
        log.warning("job_settle_refused", job_id=job["id"], what=what, error=str(exc))
    else:
        log.error("job_settle_failed", job_id=job["id"], what=what, error=describe(exc))


def _jsonable(value: Any) -> Any:
    import json

    if value is None or type(value) in (str, int, float, bool):
        return value
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


async def run_worker(url: str, handler: JobHandlers | Callable, config: WorkerConfig, token: str | None = None) -> None:
    """The CLI's entry: a worker that stops cleanly on SIGTERM and SIGINT."""
    async with JobsClient(url, token=token) as client:
        try:  # at start, a wrong or unreachable URL is said, not retried forever (the supervisor restarts us)
            await asyncio.wait_for(client.health(), STARTUP_WAIT)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"cannot reach the job server at {redact(url)}: "
                             f"{describe(exc)}") from None
        except JobsError as exc:  # something answers, but not an OJS server's health check
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{redact(url)} is not an OJS server "
                             f"(GET /ojs/v1/health answered {exc}): give the server's root, e.g. http://host:8080") from None
        await run_until_signalled(Worker(client, handler, config), via=redact(url))


async def run_until_signalled(worker: Worker, *, via: str) -> None:
    """Run `worker` until SIGTERM or SIGINT, then let it drain (`via`: what answers its calls)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    log.info("jobs_worker_started", worker_id=worker.worker_id, queues=list(worker.config.queues),
             concurrency=worker.config.concurrency, via=via)
    await worker.run()
    log.info("jobs_worker_stopped", worker_id=worker.worker_id)
