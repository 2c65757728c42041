"""A FastAPI helper for handler services (the other side of SDS-047 §12).

    async def on_event(envelope: Envelope) -> None:
        if envelope.payload.get("total", 0) < 0:
            raise Poison("negative total")         # -> 422, dead-lettered
        ...                                        # return -> 200

    app = handler_app(on_event, secret=os.environ["SEAMQ_HANDLER_SECRET"])

It verifies the signature (401), parses the envelope (422 when malformed),
and maps the function's outcome: return -> 200, AlreadyProcessed -> 409,
Poison -> 422, any other exception -> 500 (redelivered).

A function declared `envelope: Envelope[Model]` (seamq.typed) gets the payload
parsed into the model, as an in-process handler does; a payload that does not
fit is a 422 with `"reason": "schema_mismatch"`, which the consumer
dead-letters under that reason, naming the fields.

With `database_url` (the service's own database), each message runs at most
once to success, whatever the consumer redelivers (seamq.http.handled): the
function gets the connection of a transaction that also records the message,
`async def on_event(envelope, conn)`, and its writes commit with that record.
A message handled before is answered 409, one still running 423. Without it a
handler gets at least once: after a timeout, a redelivery can run while the
first call still runs.
"""

from __future__ import annotations

import inspect
import json
import logging
import traceback
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from seamq.envelope import AlreadyProcessed, Envelope, Poison, Reason
from seamq.http.handled import Claim, Handled
from seamq.http.signing import verify
from seamq.model import Header, describe
from seamq.redact import redact
from seamq.typed import model_of_handler, typed_envelope

# The standard library's logger: `seamq[http]` has no structlog, and uvicorn shows its warnings.
log = logging.getLogger("seamq.handler")

EventFunction = Callable[..., Awaitable[None]]  # (envelope) or, with a database, (envelope, conn)


def handler_router(handle: EventFunction, *, secret: str | None, path: str = "/handle",
                   handled: Handled | None = None) -> APIRouter:
    router = APIRouter()
    model = model_of_handler(handle)
    # A second required positional parameter is the connection; a defaulted one is the function's own.
    required = [p for p in inspect.signature(handle).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    takes_conn = len(required) >= 2
    if takes_conn and handled is None:
        raise TypeError(f"{getattr(handle, '__name__', handle)!r} takes a connection: give handler_app a "
                        "database_url, where each message handled is recorded with the handler's writes")

    async def run(envelope: Envelope, consumer: str) -> JSONResponse | None:
        """The function, once per message when there is a record to keep; an answer instead when
        it must not run (handled before, or running now)."""
        if handled is None:
            await handle(envelope)
            return None
        async with handled.claim(consumer, envelope.message_id) as (claim, conn):
            if claim is Claim.DONE:
                return JSONResponse({"status": "already_processed", "detail": "handled before"}, status_code=409)
            if claim is Claim.BUSY:
                return JSONResponse({"status": "in_progress", "detail": "another call is handling it"},
                                    status_code=423, headers={"Retry-After": "1"})
            await (handle(envelope, conn) if takes_conn else handle(envelope))
        return None

    @router.post(path)
    async def _handle(request: Request) -> JSONResponse:
        body = await request.body()
        if secret:
            problem = verify(secret, body, request.headers.get(Header.SIGNATURE))
            if problem:
                return JSONResponse({"error": problem}, status_code=401)
        try:
            envelope = Envelope.from_json(json.loads(body))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            return JSONResponse({"error": f"invalid envelope: {exc}"}, status_code=422)
        if model is not None:
            envelope = typed_envelope(model, envelope)
            if isinstance(envelope, str):
                return JSONResponse({"error": envelope, "reason": Reason.SCHEMA_MISMATCH.value}, status_code=422)
        try:
            answered = await run(envelope, request.headers.get(Header.CONSUMER, ""))
            if answered is not None:
                return answered
        except AlreadyProcessed as exc:
            return JSONResponse({"status": "already_processed", "detail": str(exc)}, status_code=409)
        except Poison as exc:
            return JSONResponse({"error": str(exc) or "poison"}, status_code=422)
        except Exception as exc:  # transient by default: the message is redelivered
            # Formatted and redacted here: the service's logging is its own, and may not redact.
            log.warning("handler_raised message_id=%s event=%s\n%s", envelope.message_id, envelope.subject,
                        redact("".join(traceback.format_exception(exc))).rstrip())
            return JSONResponse({"error": describe(exc)}, status_code=500)
        return JSONResponse({"status": "processed"})

    return router


def handler_app(handle: EventFunction, *, secret: str | None, path: str = "/handle",
                database_url: str | None = None) -> FastAPI:
    """`database_url`: the service's own database, where each message handled is recorded in the
    handler's transaction (exactly-once side effects; the function takes `(envelope, conn)`)."""
    handled = Handled(database_url) if database_url else None

    @asynccontextmanager
    async def lifespan(_: Any):
        yield
        if handled is not None:
            await handled.close()

    app = FastAPI(title="seamq handler", lifespan=lifespan)
    app.include_router(handler_router(handle, secret=secret, path=path, handled=handled))
    return app
