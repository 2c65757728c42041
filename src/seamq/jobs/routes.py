"""The OJS core routes (HTTP binding, levels 0-4): each parses its request and shapes the engine's answer.

Where the conformance suite and the official SDKs read one answer in
different shapes, the answer carries both (a workflow at the top and under
`workflow`; queue counts at the top, under `queue` and under `stats`; a cron
under `cron` and `cron_job`): nothing either reads is missing, and nothing is
guessed from who is asking.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import admin, attempts, beats, tenants
from seamq.jobs.api import VERSION, answer, body_of, limit_of, may_wait
from seamq.jobs.engine import EVENTS_KEPT, Engine
from seamq.jobs.model import OjsError, invalid

EXTENSIONS = [
    {"name": "progress", "uri": "urn:ojs:ext:progress", "version": "1.0"},
    {"name": "schema-registry", "uri": "urn:ojs:ext:schema-registry", "version": "1.0"},
    {"name": "dead-letter", "uri": "urn:ojs:ext:dead-letter", "version": "1.0"},
    {"name": "admin-api", "uri": "urn:ojs:ext:admin-api", "version": "1.0"},
    {"name": "durable-execution", "uri": "urn:ojs:ext:durable-execution", "version": "0.1"},
]
CAPABILITIES = {"cron": True, "workflows": True, "dead_letter": True, "unique_jobs": True, "rate_limiting": True,
                "events": True, "batch_enqueue": True, "priority": True, "progress": True, "job_versioning": True,
                "durable_execution": True}


def offset_of(text: str | None) -> int:
    try:
        value = int(text) if text is not None else 0
    except ValueError:
        raise invalid(f"offset {text!r} is not an integer") from None
    if value < 0:
        raise invalid("offset must be 0 or more")
    return value


def page(items: list, request: Request, default: int = 100) -> tuple[list, dict]:
    """`limit` and `offset` (or the JS SDK's `page` and `per_page`) over a list."""
    params = request.query_params
    limit = limit_of(params.get("per_page") or params.get("limit"), default)
    start = offset_of(params.get("offset"))
    if params.get("page"):
        start = (max(offset_of(params["page"]), 1) - 1) * limit
    return items[start:start + limit], {"total": len(items), "limit": limit, "offset": start,
                                        "has_more": start + limit < len(items)}


def queue_answer(stats: dict) -> dict:
    counts = {"queue": stats["name"], **{k: v for k, v in stats.items() if k not in ("name", "paused")}}
    status = "paused" if stats["paused"] else "active"
    return {"queue": stats, **stats, "status": status, "stats": counts}


def with_request_id(body: Any, request: Request) -> Any:
    """A job pushed over HTTP keeps the request that made it in `meta.request_id` (X-Request-ID, as
    the client sent it or as this server made it), so a trace can go from the job back to the call;
    a client's own `request_id` in meta is kept."""
    meta = body.get("meta") if isinstance(body, dict) else None
    if not isinstance(body, dict) or (meta is not None and not isinstance(meta, dict)) or "request_id" in (meta or {}):
        return body
    return {**body, "meta": {**(meta or {}), "request_id": request.state.request_id}}


def tenant_of(request: Request) -> str | None:
    """The tenant a request names (X-OJS-Tenant), "" for the default one, None for none."""
    try:
        return tenants.given(request.headers.get(tenants.HEADER))
    except ValueError as exc:
        raise invalid(str(exc)) from None


def stamped(body: Any, request: Request) -> Any:
    """A push body with the request's tenant (seamq.jobs.tenants.stamped); 400 when they disagree."""
    try:
        return tenants.stamped(with_request_id(body, request), tenant_of(request))
    except ValueError as exc:
        raise invalid(str(exc)) from None


async def owned(engine: Engine, request: Request) -> dict:
    """The job of the path as its tenant sees it: a request naming another tenant is told there is no
    such job (as for a job of no tenant: tenants are isolated in every view)."""
    job = await engine.ops.info(request.path_params["job_id"])
    tenant = tenant_of(request)
    if tenant is not None and tenants.of(job) != tenant:
        raise OjsError(404, "not_found", f"job {job['id']} not found")
    return job


def named(request: Request, body: dict) -> Any:
    """The job an ack or a nack is about: the body's `job_id` (/workers/ack), or the path's
    (/jobs/{id}/ack, as the newer suites send them), which a body naming another contradicts."""
    job_id = request.path_params.get("job_id")
    if job_id is None:
        return body.get("job_id")
    if body.get("job_id") not in (None, job_id):
        raise invalid(f"the body's job_id {body.get('job_id')!r} is not the job of the path, {job_id}")
    return job_id


def core(engine: Engine, conformance_level: int) -> list[Route]:
    async def push(request: Request) -> Response:
        status, job = await engine.ops.push(stamped(await body_of(request), request))
        said = answer({"job": job, "id": job["id"]}, status)  # `$.id`: what the newer suites capture
        said.headers.update({**await engine.queues.pressure(job["queue"]), **await engine.limiter.headers(job)})
        return said

    async def push_batch(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, dict) and isinstance(body.get("jobs"), list):
            body = {**body, "jobs": [stamped(job, request) for job in body["jobs"]]}
        jobs = await engine.ops.push_batch(body)
        return answer({"jobs": jobs, "count": len(jobs)}, 201)

    async def info(request: Request) -> Response:
        return answer({"job": await owned(engine, request)})

    async def cancel(request: Request) -> Response:
        return answer({"job": await engine.ops.cancel((await owned(engine, request))["id"])})

    async def fetch(request: Request) -> Response:
        body = await body_of(request)
        jobs = await engine.ops.fetch(body.get("queues"), body.get("count", 1), body.get("worker_id"),
                                      body.get("visibility_timeout_ms"), tenant_of(request))
        return answer({"jobs": jobs})

    async def ack(request: Request) -> Response:
        body = await body_of(request)
        return answer(attempts.ack_answer(await engine.ops.ack(named(request, body), body.get("result"),
                                                               may_wait=may_wait(request))))

    async def nack(request: Request) -> Response:
        body = await body_of(request)
        return answer(attempts.nack_answer(await engine.ops.nack(named(request, body), body.get("error"),
                                                                 body.get("requeue", False), may_wait=may_wait(request))))

    async def beat(request: Request) -> Response:  # graceful shutdown: the state a worker says it is in
        body = await body_of(request)
        return answer(await beats.beat(engine.ops, body.get("worker_id"), body.get("state"), body.get("active_jobs")))

    async def worker_health(request: Request) -> Response:
        """A worker as this server last heard it: 200 while it runs, 503 while it is quiet, draining
        or stopping (no job goes to it), 404 for one this server has not heard from."""
        worker_id, now = request.path_params["worker_id"], engine.ops.clock()
        shared = engine.queues.said_by(worker_id) or await engine.queues.said_stored(worker_id)
        worker = engine.ops.workers.heard(worker_id, shared, now)
        if worker is None:
            raise OjsError(404, "not_found", f"this server has not heard from worker {worker_id}")
        shown = worker.public(now)
        return answer({"worker_id": worker_id, **shown}, 200 if shown["state"] == "running" else 503)

    async def heartbeat(request: Request) -> Response:
        body = await body_of(request)
        return answer(await beats.heartbeat(engine.ops, body.get("worker_id"), body.get("active_jobs"),
                                            body.get("visibility_timeout_ms"), body.get("active_job_ids")))

    async def events(request: Request) -> Response:
        params = request.query_params
        split = lambda name: [v for v in (params.get(name) or "").split(",") if v]  # noqa: E731
        try:
            after = int(params.get("after") or 0)
        except ValueError:
            raise invalid("after must be a cursor from an earlier answer") from None
        if "page" in params or "per_page" in params:  # the admin UI pages through what is kept
            found = (await engine.events.list(split("types") or split("type"), split("queues"), EVENTS_KEPT))["events"]
            return answer(admin.paged([{**e, "timestamp": e["time"]} for e in reversed(found)], params))
        return answer(await engine.events.list(split("types"), split("queues"), limit_of(params.get("limit")), after))

    async def dead_letters(request: Request) -> Response:
        found = await engine.dead_letters(request.query_params.get("queue"))
        jobs, pagination = page(found, request)
        return answer({"jobs": jobs, "pagination": pagination})

    async def delete_dead_letter(request: Request) -> Response:
        return answer(await engine.delete_dead_letter(request.path_params["job_id"]))

    async def retry_dead_letter(request: Request) -> Response:
        return answer({"job": await engine.retry_dead_letter(request.path_params["job_id"])})

    async def create_workflow(request: Request) -> Response:
        workflow = await engine.flows.create(await body_of(request))
        return answer({"workflow": workflow, **workflow}, 201)

    async def workflow(request: Request) -> Response:
        found = await engine.flows.get(request.path_params["workflow_id"])
        return answer({"workflow": found, **found})

    async def cancel_workflow(request: Request) -> Response:
        found = await engine.flows.cancel(request.path_params["workflow_id"])
        return answer({"workflow": found, **found})

    async def register_cron(request: Request) -> Response:
        registered = await engine.crontab.register(await body_of(request))
        return answer({"cron": registered, "cron_job": registered}, 201)

    async def list_crons(request: Request) -> Response:
        crons, pagination = page(await engine.crontab.listing(), request)
        return answer({"crons": crons, "cron_jobs": crons, "pagination": pagination})

    async def delete_cron(request: Request) -> Response:
        deleted = await engine.crontab.delete(request.path_params["name"])
        return answer({"cron": deleted, "cron_job": deleted})

    async def queues(request: Request) -> Response:
        found, pagination = page(await engine.queues.listing(), request)
        return answer({"queues": found, "pagination": pagination})

    async def queue_stats(request: Request) -> Response:  # a tenant's jobs in it alone, when one is named
        return answer(queue_answer(await engine.queues.stats(request.path_params["name"], tenant_of(request))))

    async def pause(request: Request) -> Response:
        await engine.set_paused(request.path_params["name"], True)
        return answer(queue_answer(await engine.queues.stats(request.path_params["name"])))

    async def resume(request: Request) -> Response:
        await engine.set_paused(request.path_params["name"], False)
        return answer(queue_answer(await engine.queues.stats(request.path_params["name"])))

    async def manifest(request: Request) -> Response:
        return answer({
            "specversion": VERSION, "ojs_version": VERSION,
            "implementation": {"name": "seamq", "version": _version(), "language": "python",
                               "homepage": "docs/jobs.md"},
            "conformance_level": conformance_level, "protocols": ["http"], "backend": "nats-jetstream-kv",
            "capabilities": CAPABILITIES, "extensions": {"official": EXTENSIONS, "experimental": []},
        })

    return [
        Route("/ojs/v1/workers/ack", ack, methods=["POST"]),  # first: routes are matched in order, and these
        Route("/ojs/v1/workers/fetch", fetch, methods=["POST"]),  # two are most of a busy server's requests
        Route("/ojs/v1/jobs", push, methods=["POST"]),
        Route("/ojs/v1/jobs/batch", push_batch, methods=["POST"]),
        Route("/ojs/v1/jobs/{job_id}", info, methods=["GET"]),
        Route("/ojs/v1/jobs/{job_id}", cancel, methods=["DELETE"]),
        Route("/ojs/v1/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/ojs/v1/jobs/{job_id}/ack", ack, methods=["POST"]),
        Route("/ojs/v1/jobs/{job_id}/nack", nack, methods=["POST"]),
        Route("/ojs/v1/workers/nack", nack, methods=["POST"]),
        Route("/ojs/v1/workers/heartbeat", heartbeat, methods=["POST"]),
        Route("/ojs/v1/workers/beat", beat, methods=["POST"]),
        Route("/ojs/v1/workers/{worker_id}/health", worker_health, methods=["GET"]),
        Route("/ojs/v1/events", events, methods=["GET"]),
        Route("/ojs/v1/dead-letter", dead_letters, methods=["GET"]),
        Route("/ojs/v1/dead-letter/{job_id}", delete_dead_letter, methods=["DELETE"]),
        Route("/ojs/v1/dead-letter/{job_id}/retry", retry_dead_letter, methods=["POST"]),
        Route("/ojs/v1/workflows", create_workflow, methods=["POST"]),
        Route("/ojs/v1/workflows/{workflow_id}", workflow, methods=["GET"]),
        Route("/ojs/v1/workflows/{workflow_id}", cancel_workflow, methods=["DELETE"]),
        Route("/ojs/v1/cron", register_cron, methods=["POST"]),
        Route("/ojs/v1/cron", list_crons, methods=["GET"]),
        Route("/ojs/v1/cron/{name}", delete_cron, methods=["DELETE"]),
        Route("/ojs/v1/queues", queues, methods=["GET"]),
        Route("/ojs/v1/queues/{name}/stats", queue_stats, methods=["GET"]),
        Route("/ojs/v1/queues/{name}", queue_stats, methods=["GET"]),
        Route("/ojs/v1/queues/{name}/pause", pause, methods=["POST"]),
        Route("/ojs/v1/queues/{name}/resume", resume, methods=["POST"]),
        Route("/ojs/manifest", manifest, methods=["GET"]),
    ]


@functools.cache  # read once: the manifest is asked for by every dashboard poll
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("seamq")
    except PackageNotFoundError:
        return "0"
