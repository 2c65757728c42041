"""In-process handlers: a plain async function, with small wrappers around it.

    async def on_order_placed(envelope: Envelope, tx: AsyncConnection) -> None:
        await tx.execute("INSERT INTO shipments ...")   # commits with the inbox mark

Like Watermill's middlewares, timeouts and the mapping of exceptions to
outcomes are wrappers composed around the function, not logic inside it:
raise Poison (422), AlreadyProcessed (409), or anything else (retry).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import json

from seamq.envelope import AlreadyProcessed, Envelope, HandlerResult, Outcome, Poison, Reason

Fn = Callable[[Envelope, Any], Awaitable[Any]]


def outcomes(fn: Fn) -> Callable[[Envelope, Any], Awaitable[HandlerResult]]:
    """Exceptions -> HandlerResult."""

    async def wrapped(envelope: Envelope, conn: Any) -> HandlerResult:
        try:
            await fn(envelope, conn)
        except AlreadyProcessed as exc:
            return HandlerResult(Outcome.ALREADY_PROCESSED, str(exc) or None)
        except Poison as exc:
            return HandlerResult(Outcome.POISON, str(exc) or "poison")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return HandlerResult(Outcome.RETRY, f"{type(exc).__name__}: {exc}")
        return HandlerResult(Outcome.OK)

    return wrapped


def timeout(seconds: float, fn: Callable[..., Awaitable[HandlerResult]]):
    """A handler that overruns behaves like a 5xx: retried later."""

    async def wrapped(envelope: Envelope, conn: Any) -> HandlerResult:
        try:
            async with asyncio.timeout(seconds):  # no extra task per call, unlike wait_for
                return await fn(envelope, conn)
        except TimeoutError:
            return HandlerResult(Outcome.RETRY, f"handler timed out after {seconds:g}s")

    return wrapped


class InProcessHandler:
    """A function run inside the consumer's transaction: exactly-once side effects."""

    transactional = True

    def __init__(self, fn: Fn, *, timeout_seconds: float = 30.0) -> None:
        self.fn = fn
        self._call = timeout(timeout_seconds, outcomes(fn))

    def __repr__(self) -> str:
        return f"InProcessHandler({getattr(self.fn, '__qualname__', self.fn)})"

    async def __call__(self, envelope: Envelope, conn: Any, traceparent: str | None = None) -> HandlerResult:
        return await self._call(envelope, conn)


class SchemaChecked:
    """Validates the payload against the version's schema before the handler sees it.

    A mismatch is poison (422 semantics) with reason `schema_mismatch`.
    """

    def __init__(self, handler, schema: str) -> None:
        from jsonschema import Draft202012Validator

        self.handler = handler
        self.transactional = handler.transactional
        self.validator = Draft202012Validator(json.loads(schema))

    async def __call__(self, envelope: Envelope, conn: Any, traceparent: str | None = None) -> HandlerResult:
        try:
            error = next(iter(self.validator.iter_errors(envelope.payload)), None)
        except RecursionError:
            return HandlerResult(Outcome.POISON, "payload: nested too deeply to validate", reason=Reason.SCHEMA_MISMATCH)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "payload"
            return HandlerResult(Outcome.POISON, f"{where}: {error.message}", reason=Reason.SCHEMA_MISMATCH)
        return await self.handler(envelope, conn, traceparent)
