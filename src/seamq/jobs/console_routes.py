"""The lists and switches the official admin UI reads beside the admin API (spec/openapi.yaml):
cron jobs, workflows, events by page, rate limits, unique-job locks, middleware, maintenance mode.

Each answers the UI's shape (`items` and `pagination`) from what the engine
holds; where seamq has nothing of a kind (server-side middleware) the list is
empty, which is the truth, not a placeholder.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import admin
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine
from seamq.jobs.model import FINISHED, invalid
from seamq.jobs.unique import fingerprint


def console_routes(engine: Engine) -> list[Route]:
    async def crons(request: Request) -> Response:
        rows = [{**c, "id": c["name"], "schedule": c["expression"]} for c in await engine.crontab.listing()]
        return answer(admin.paged(rows, request.query_params))

    async def cron(request: Request) -> Response:
        name = request.path_params["name"]
        found = await engine.crontab.get(name)
        return answer({**found, "id": found["name"], "schedule": found["expression"]})

    async def toggle_cron(request: Request) -> Response:
        body = await body_of(request)
        if not isinstance(body.get("enabled"), bool) or set(body) - {"enabled"}:
            raise invalid("send {\"enabled\": true} or {\"enabled\": false}; nothing else of a cron can be changed here")
        return answer(await engine.crontab.set_enabled(request.path_params["name"], body["enabled"]))

    async def delete_cron(request: Request) -> Response:
        await engine.crontab.delete(request.path_params["name"])
        return Response(status_code=204)

    async def workflows(request: Request) -> Response:
        state = request.query_params.get("state")
        rows = [w for w in await engine.flows.listing() if not state or w["state"] == state]
        return answer(admin.paged(rows, request.query_params))

    async def rate_limits(request: Request) -> Response:
        rows = []
        for limit in sorted(engine.queues.of("limit."), key=lambda r: r["queue"]):
            stats = await engine.queues.stats(limit["queue"])
            rows.append({"key": limit["queue"], "limit": limit["rate"], "period": "PT1S", "active": stats["active"],
                         "waiting": stats["available"]})
        return answer(admin.paged([*rows, *await engine.limiter.listing()], request.query_params))

    async def rate_limit(request: Request) -> Response:
        return answer(await engine.limiter.inspect(request.path_params["key"]))

    async def override_rate_limit(request: Request) -> Response:
        return answer(await engine.limiter.override(request.path_params["key"], await body_of(request)))

    async def unique_jobs(request: Request) -> Response:
        rows = [{"key": fingerprint(r), "job_id": r["id"], "type": r["type"], "queue": r["queue"], "state": r["state"]}
                for r in await engine.jobs() if r.get("unique") and r["state"] not in FINISHED]
        return answer(admin.paged(rows, request.query_params))

    async def middleware(request: Request) -> Response:
        return answer({"enqueue": [], "execution": []})  # seamq runs no server-side middleware

    async def maintenance(request: Request) -> Response:
        return answer(engine.queues.maintenance())

    async def set_maintenance(request: Request) -> Response:
        body = await body_of(request)
        if not isinstance(body.get("enabled"), bool):
            raise invalid("enabled must be true or false")
        reason, ends = body.get("reason"), body.get("ends_at") or body.get("estimated_end")
        if reason is not None and not isinstance(reason, str) or ends is not None and not isinstance(ends, str):
            raise invalid("reason and ends_at must be strings")
        return answer(await engine.queues.set_maintenance(body["enabled"], reason, ends))

    return [
        Route("/ojs/v1/crons", crons, methods=["GET"]),
        Route("/ojs/v1/crons/{name}", cron, methods=["GET"]),
        Route("/ojs/v1/crons/{name}", toggle_cron, methods=["PATCH"]),
        Route("/ojs/v1/crons/{name}", delete_cron, methods=["DELETE"]),
        Route("/ojs/v1/workflows", workflows, methods=["GET"]),
        Route("/ojs/v1/rate-limits", rate_limits, methods=["GET"]),
        Route("/ojs/v1/rate-limits/{key}", rate_limit, methods=["GET"]),
        Route("/ojs/v1/rate-limits/{key}", override_rate_limit, methods=["PUT"]),
        Route("/ojs/v1/unique-jobs", unique_jobs, methods=["GET"]),
        Route("/ojs/v1/middleware", middleware, methods=["GET"]),
        Route("/ojs/v1/admin/system/maintenance", maintenance, methods=["GET"]),
        Route("/ojs/v1/admin/system/maintenance", set_maintenance, methods=["POST"]),
    ]
