"""Fairness's admin routes: tenants (OJS multi-tenancy, its section 10: each tenant's counts in every
queue, tallied with its jobs' changes, seamq.jobs.tenants, and its jobs), worker pools and the
scheduling statistics (OJS fair scheduling, its section 10: seamq.jobs.pools)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import admin, pools, tenants
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine
from seamq.jobs.model import STATES, OjsError, check_queue, invalid, utcnow


def fair_routes(engine: Engine) -> list[Route]:
    def named(request: Request) -> str:
        tenant = request.path_params["tenant_id"]
        if not tenants.PATTERN.fullmatch(tenant):
            raise invalid(f"a tenant id matches {tenants.PATTERN.pattern}")
        return tenant

    def summary(tenant: str, tallied: dict[str, dict[str, int]]) -> dict:
        queues = engine.queues.tenant_stats(tenant, tallied)
        jobs = {state: sum(counts[state] for counts in queues.values()) for state in STATES}
        return {"tenant_id": tenant, "total_jobs": sum(jobs.values()), "jobs": jobs, "queues": queues}

    async def listing(request: Request) -> Response:
        tallied = await engine.queues.tallied()
        rows = [summary(tenant, tallied) for tenant in engine.queues.tenant_names(tallied)]
        return answer(admin.paged(rows, request.query_params))

    async def stats(request: Request) -> Response:
        return answer(summary(named(request), await engine.queues.tallied()))

    async def jobs(request: Request) -> Response:
        tenant = named(request)
        chosen = admin.Filter.of(request.query_params, strict=False)
        found = [r for r in chosen.select(await engine.jobs(chosen.queue, chosen.state)) if tenants.of(r) == tenant]
        params = request.query_params
        return answer(admin.paged([admin.summary(r) for r in admin.sort(found, params.get("sort"), params.get("order"))],
                                  params))

    async def pool_list(request: Request) -> Response:
        return answer(admin.paged([p.public() for p in engine.queues.pools()], request.query_params))

    async def pool(request: Request) -> Response:
        found = next((p for p in engine.queues.pools() if p.name == request.path_params["name"]), None)
        if found is None:
            raise OjsError(404, "not_found", f"no pool {request.path_params['name']!r}")
        return answer({"pool": found.public()})

    async def set_pool(request: Request) -> Response:
        name, known = request.path_params["name"], {p.name for p in engine.queues.pools()}
        try:
            made = pools.pool_of(name, await body_of(request), check_queue)
        except ValueError as exc:
            raise invalid(str(exc)) from None
        await engine.queues.set_pool(made, name)
        return answer({"pool": made.public()}, 200 if name in known else 201)

    async def delete_pool(request: Request) -> Response:
        await engine.queues.set_pool(None, request.path_params["name"])
        return Response(status_code=204)

    async def scheduling(request: Request) -> Response:
        """What this server handed out in the last minute, per queue (`scope: server`, as its throughput)."""
        now, names = utcnow(), await engine.queues.names()
        counts = {name: engine.meter.rate("dispatched", now, name) for name in names}
        total = sum(counts.values()) or 1
        rows = [{"name": name, "dispatch_count_1m": n, "dispatch_ratio_1m": round(n / total, 3),
                 "pool": next((p.name for p in engine.queues.pools() if name in p.queues), None)}
                for name, n in counts.items()]
        return answer({"stats": {"queues": rows, "dispatched_1m": sum(counts.values()),
                                 "pools": [p.public() for p in engine.queues.pools()]},
                       "queues": rows, "window": "PT1M", "scope": "server"})

    prefix = "/ojs/v1/admin"
    return [Route(f"{prefix}/tenants", listing, methods=["GET"]),
            Route(f"{prefix}/tenants/{{tenant_id}}", stats, methods=["GET"]),
            Route(f"{prefix}/tenants/{{tenant_id}}/stats", stats, methods=["GET"]),
            Route(f"{prefix}/tenants/{{tenant_id}}/jobs", jobs, methods=["GET"]),
            Route(f"{prefix}/pools", pool_list, methods=["GET"]),
            Route(f"{prefix}/pools/{{name}}", pool, methods=["GET"]),
            Route(f"{prefix}/pools/{{name}}", set_pool, methods=["PUT"]),
            Route(f"{prefix}/pools/{{name}}", delete_pool, methods=["DELETE"]),
            Route(f"{prefix}/scheduling/stats", scheduling, methods=["GET"])]
