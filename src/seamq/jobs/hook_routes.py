"""The webhook routes (`ext-webhooks`): subscriptions, and what became of their deliveries. A
subscription's secret is never shown, except once when this server made it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import time
from datetime import datetime, timezone

from seamq import codec
from seamq.jobs import webhooks
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError, iso, utcnow
from seamq.jobs.ports import Post


def hook_routes(engine: Engine, post: Post | None = None) -> list[Route]:
    """`post`: how a test ping is sent (seamq.jobs.poster); without one, `.../test` is refused (501)."""
    subscriptions = engine.webhooks

    async def create(request: Request) -> Response:
        record, made = await subscriptions.create(await body_of(request))
        shown = webhooks.public(record)
        return answer({"subscription": {**shown, **({"secret": made} if made else {})}, **shown}, 201)

    async def listing(request: Request) -> Response:
        return answer({"subscriptions": [webhooks.public(r) for r in await subscriptions.listing()]})

    async def one(request: Request) -> Response:
        return answer({"subscription": webhooks.public(await subscriptions.get(request.path_params["sub_id"]))})

    async def update(request: Request) -> Response:
        record = await subscriptions.update(request.path_params["sub_id"], await body_of(request))
        return answer({"subscription": webhooks.public(record)})

    async def delete(request: Request) -> Response:
        await subscriptions.delete(request.path_params["sub_id"])
        return answer({"deleted": True, "id": request.path_params["sub_id"]})

    async def rotate(request: Request) -> Response:
        record, secret = await subscriptions.rotate(request.path_params["sub_id"], await body_of(request))
        return answer({"subscription": {**webhooks.public(record), "secret": secret}, "secret": secret,
                       "previous_secret_valid_until": iso(datetime.fromtimestamp(record["_old_until"], timezone.utc))})

    async def test(request: Request) -> Response:
        """A `webhook.test` event, sent now and answered with what the receiver said (never retried)."""
        if post is None:
            raise OjsError(501, "unsupported", "this server sends no webhook")
        record = await subscriptions.get(request.path_params["sub_id"])
        event, now = webhooks.ping(record, utcnow()), int(time.time())
        body = codec.dumps(event)
        started = time.monotonic()
        status, error = await post(record["url"], body, webhooks.headers(record, event, f"ping_{event['id']}", now, body),
                                   webhooks.TIMEOUT)
        return answer({"success": webhooks.outcome(status) == "delivered", "status_code": status, "error": error,
                       "response_time_ms": round((time.monotonic() - started) * 1000), "event_id": event["id"]})

    async def deliveries(request: Request) -> Response:
        return answer({"deliveries": await subscriptions.deliveries(request.path_params["sub_id"])})

    path = "/ojs/v1/webhooks/subscriptions"
    return [Route(path, create, methods=["POST"]), Route(path, listing, methods=["GET"]),
            Route(path + "/{sub_id}", one, methods=["GET"]), Route(path + "/{sub_id}", update, methods=["PATCH"]),
            Route(path + "/{sub_id}", delete, methods=["DELETE"]),
            Route(path + "/{sub_id}/deliveries", deliveries, methods=["GET"]),
            Route(path + "/{sub_id}/test", test, methods=["POST"]),
            Route(path + "/{sub_id}/rotate-secret", rotate, methods=["POST"])]
