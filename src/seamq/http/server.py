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
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from seamq.envelope import AlreadyProcessed, Envelope, Poison, Reason
from seamq.http.signing import verify
from seamq.model import Header, describe
from seamq.redact import redact
from seamq.typed import model_of_handler, typed_envelope

# The standard library's logger: `seamq[http]` has no structlog, and uvicorn shows its warnings.
log = logging.getLogger("seamq.handler")

EventFunction = Callable[[Envelope], Awaitable[None]]


def handler_router(handle: EventFunction, *, secret: str | None, path: str = "/handle") -> APIRouter:
    router = APIRouter()
    model = model_of_handler(handle)

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
            await handle(envelope)
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


def handler_app(handle: EventFunction, *, secret: str | None, path: str = "/handle") -> FastAPI:
    app = FastAPI(title="seamq handler")
    app.include_router(handler_router(handle, secret=secret, path=path))
    return app
