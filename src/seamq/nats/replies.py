"""Requests whose answers come back on one wildcard inbox: one answer (a JetStream publish's ack), or
a run of them ended by a status (a pull, a batched direct get).

nats-py's `request()` makes a token, encodes the headers and starts an `asyncio.wait_for` (a timer
and a waiter) for every request; the job server makes two or three per processed job. Here an
answer finds its waiter by the number at the end of its subject, and one sweep a quarter second
fails those whose answer did not come in time. An answer that comes after its waiter gave up finds
no one and is dropped, so it can never be taken for the answer to a later request.

At most IN_FLIGHT requests wait for an answer at once; more wait their turn before they are sent,
so a burst (eight batches of 1,000 jobs, each job's entry a publish) is not timed out by its own
queue on a busy machine: a request's time starts when it is sent.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import AsyncIterator

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

from seamq.nats.wire import Wire

SWEEP = 0.25  # seconds between looks for answers that did not come
IN_FLIGHT = 512  # requests waiting for their answer at once


class _Run:
    """The answers to one request that has several, as they come."""

    __slots__ = ("messages", "arrived")

    def __init__(self) -> None:
        self.messages: deque[Msg | Exception] = deque()
        self.arrived = asyncio.Event()

    def add(self, message: Msg | Exception) -> None:
        self.messages.append(message)
        self.arrived.set()


class Replies:
    def __init__(self, nc: Client, *, timeout: float = 5.0, in_flight: int = IN_FLIGHT) -> None:
        self.nc, self.timeout = nc, timeout
        self.wire = Wire(nc)
        self._prefix = nc.new_inbox() + "."
        self._next = 0
        self._waiting: dict[int, tuple[float, asyncio.Future | _Run]] = {}  # number: (deadline, waiter)
        self._sub = self._sweeper = None
        self._turns = asyncio.Semaphore(in_flight)

    async def start(self) -> "Replies":
        self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_answer)
        self._sweeper = asyncio.create_task(self._sweep())
        return self

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._sub is not None:
            await self._sub.unsubscribe()
        self._fail(lambda deadline: True, nats.errors.ConnectionClosedError())

    async def _on_answer(self, message: Msg) -> None:
        try:
            number = int(message.subject[len(self._prefix):])
        except ValueError:  # anyone may publish to an inbox: not an answer of ours
            return
        waiting = self._waiting.get(number)
        if waiting is None:
            return
        waiter = waiting[1]
        if isinstance(waiter, _Run):
            waiter.add(message)
            return
        self._forget(number)
        if not waiter.done():  # its caller may have gone
            waiter.set_result(message)

    def _forget(self, number: int) -> None:
        """A waiter for one answer holds a turn until it is forgotten."""
        waiting = self._waiting.pop(number, None)
        if waiting is not None and not isinstance(waiting[1], _Run):
            self._turns.release()

    def _ask(self, waiter, timeout: float | None = None) -> tuple[int, str]:
        self._next += 1
        self._waiting[self._next] = (asyncio.get_running_loop().time() + (timeout or self.timeout), waiter)
        return self._next, f"{self._prefix}{self._next}"

    async def request(self, subject: str, payload: bytes, headers: bytes = b"", *,
                      timeout: float | None = None) -> Msg:
        """The one answer (nats.errors.TimeoutError if none came within `timeout`, else the default)."""
        return await (await self.sent(subject, payload, headers, timeout=timeout))

    async def sent(self, subject: str, payload: bytes, headers: bytes = b"", *,
                   timeout: float | None = None) -> asyncio.Future:
        """The request sent; the future of its one answer, to await with others' (no task each). Its
        turn is given back when the answer comes, or its time is up."""
        await self._turns.acquire()
        future = asyncio.get_running_loop().create_future()
        number, reply = self._ask(future, timeout)
        try:
            await self.wire.publish(subject, payload, reply=reply, headers=headers)
        except BaseException:
            self._forget(number)
            raise
        return future

    async def answers(self, subject: str, payload: bytes, ends: tuple[str, ...]) -> AsyncIterator[Msg]:
        """Each answer as it comes, until one with a `Status` header (not yielded): one of `ends`
        ends the run, any other is raised (a refused request must not pass for an empty answer)."""
        run = _Run()
        number, reply = self._ask(run)
        try:
            await self.wire.publish(subject, payload, reply=reply)
            while True:
                if not run.messages:
                    run.arrived.clear()
                    await run.arrived.wait()
                message = run.messages.popleft()
                if isinstance(message, Exception):
                    raise message
                status = message.headers.get("Status") if message.headers else None
                if status in ends:
                    return
                if status:
                    raise nats.js.errors.APIError(code=int(status) if status.isdigit() else None,
                                                  description=message.headers.get("Description") or f"status {status}")
                yield message
        finally:
            self._waiting.pop(number, None)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP)
            now = asyncio.get_running_loop().time()
            self._fail(lambda deadline, now=now: deadline <= now, nats.errors.TimeoutError())

    def _fail(self, due, error: Exception) -> None:
        ended = [number for number, (deadline, _) in self._waiting.items() if due(deadline)]
        for number in ended:
            waiter = self._waiting[number][1]
            self._forget(number)
            if isinstance(waiter, _Run):
                waiter.add(error)
            elif not waiter.done():
                waiter.set_exception(error)


def acked(message: Msg) -> dict:
    """A JetStream publish's ack (`seq`, or `error`), as the server wrote it; no stream for the
    subject is raised as nats-py raises it."""
    if not message.data:
        if message.headers and message.headers.get("Status") == "503":
            raise nats.errors.NoRespondersError
        raise nats.js.errors.APIError(description=f"empty ack (status {(message.headers or {}).get('Status')})")
    return orjson.loads(message.data)
