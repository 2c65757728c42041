"""The webhook routes (`ext-webhooks`): subscriptions, and what became of their deliveries. A
subscription's secret is never shown, except once when this server made it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import webhooks
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine


def hook_routes(engine: Engine) -> list[Route]:
    subscriptions = engine.webhooks

    async def create(request: Request) -> Response:
        record, made = await subscriptions.create(await body_of(request))
        shown = webhooks.public(record)
        return answer({"subscription": {**shown, **({"secret": made} if made else {})}, **shown}, 201)

    async def listing(request: Request) -> Response:
        return answer({"subscriptions": [webhooks.public(r) for r in subscriptions.all()]})

    async def one(request: Request) -> Response:
        return answer({"subscription": webhooks.public(await subscriptions.get(request.path_params["sub_id"]))})

    async def update(request: Request) -> Response:
        record = await subscriptions.update(request.path_params["sub_id"], await body_of(request))
        return answer({"subscription": webhooks.public(record)})

    async def delete(request: Request) -> Response:
        await subscriptions.delete(request.path_params["sub_id"])
        return answer({"deleted": True, "id": request.path_params["sub_id"]})

    async def deliveries(request: Request) -> Response:
        return answer({"deliveries": await subscriptions.deliveries(request.path_params["sub_id"])})

    path = "/ojs/v1/webhooks/subscriptions"
    return [Route(path, create, methods=["POST"]), Route(path, listing, methods=["GET"]),
            Route(path + "/{sub_id}", one, methods=["GET"]), Route(path + "/{sub_id}", update, methods=["PATCH"]),
            Route(path + "/{sub_id}", delete, methods=["DELETE"]),
            Route(path + "/{sub_id}/deliveries", deliveries, methods=["GET"])]
