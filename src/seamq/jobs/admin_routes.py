"""The admin API (`urn:ojs:ext:admin-api`, spec/ojs-admin-api.md) and its dead-letter routes: what the
official admin UI, `seamq jobs` and an operator's scripts call, all under `/ojs/v1/admin/`.

Bulk actions go job by job and report each one that could not be done
(`errors`), so a bulk retry that meets a job another client just changed says
so instead of counting it as done.
"""

from __future__ import annotations

from collections import Counter

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import admin, backpressure, tenants
from seamq.jobs.admin import Filter
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine
from seamq.jobs.routes import tenant_of
from seamq.jobs.model import FINISHED, STATES, OjsError, State, check_queue, invalid, iso, utcnow

SCOPE = "server"  # workers and throughput are what this server process saw (seamq.jobs.activity)


def admin_routes(engine: Engine) -> list[Route]:
    async def listed(request: Request, records) -> dict:
        """`records`: a function of (queue, state) that can select by them cheaply."""
        params = request.query_params
        chosen = Filter.of(params, strict=False)
        records = await records(chosen.queue, chosen.state)
        tenant = tenant_of(request)  # a tenant sees its jobs alone
        records = [r for r in records if tenant is None or tenants.of(r) == tenant]
        found = admin.sort(chosen.select(records), params.get("sort"), params.get("order"))
        return admin.paged([admin.summary(r) for r in found], params)

    async def queue_row(name: str) -> dict:
        stats = await engine.queues.stats(name)
        counts = {k: v for k, v in stats.items() if k not in ("name", "paused")}
        return {"name": name, "state": "paused" if stats["paused"] else "active", "paused": stats["paused"],
                "counts": counts, "throughput": engine.meter.per_minute(utcnow(), name)}

    async def stats(request: Request) -> Response:
        queues = [q["name"] for q in await engine.queues.listing()]
        totals = {state: 0 for state in STATES}
        for name in queues:
            counts = await engine.queues.stats(name)
            for state in STATES:
                totals[state] += counts[state]
        workers = engine.workers.listing(utcnow())[1]
        return answer({"queues": len(queues), "workers": workers["total"], "jobs": totals,
                       "throughput": engine.meter.per_minute(utcnow()), "scope": SCOPE,
                       "uptime_seconds": round((utcnow() - engine.started_at).total_seconds())})

    async def history(request: Request) -> Response:
        params = request.query_params
        times = Filter.of({"since": params.get("since"), "until": params.get("until")})
        queue = params.get("queue")
        return answer(engine.meter.history(params.get("period") or "5m", times.since, times.until, utcnow(),
                                           check_queue(queue) if queue else None))

    async def queues(request: Request) -> Response:
        return answer(admin.paged([await queue_row(q["name"]) for q in await engine.queues.listing()],
                                  request.query_params))

    async def queue(request: Request) -> Response:
        name = request.path_params["name"]
        row = await queue_row(name)
        waiting = [r["enqueued_at"] for r in await engine.jobs(name, "available") if r.get("enqueued_at")]
        if waiting:
            row["oldest_available_at"] = min(waiting)
        return answer(row)

    async def configure(request: Request) -> Response:  # ext-backpressure: {"backpressure": {max_depth, ...}}
        name, body = check_queue(request.path_params["name"]), await body_of(request)
        if set(body) - {"backpressure"}:
            raise invalid(f"a queue's config holds its backpressure only, not {sorted(set(body) - {'backpressure'})}: "
                          "concurrency is each worker's (--concurrency), a rate limit a job option (options.rate_limit)")
        await engine.queues.configure(name, backpressure.bound_of(body.get("backpressure", {})))
        return await config(request)

    async def config(request: Request) -> Response:
        name = check_queue(request.path_params["name"])
        bound = engine.queues.bound(name)
        return answer({"queue": name, "config": {"backpressure": bound.public() if bound else None}})

    async def pause(request: Request) -> Response:
        return answer({**await engine.set_paused(request.path_params["name"], True), "paused_at": iso(utcnow())})

    async def resume(request: Request) -> Response:
        return answer({**await engine.set_paused(request.path_params["name"], False), "resumed_at": iso(utcnow())})

    async def purge(request: Request) -> Response:
        name = check_queue(request.path_params["name"])
        body = await body_of(request)
        admin.confirmed(body)
        states = body.get("states")
        if not isinstance(states, list) or not states or not all(s in FINISHED for s in states):
            raise invalid(f"states must be a list of finished states ({', '.join(sorted(FINISHED))}); "
                          "waiting and running jobs are cancelled, not purged")
        found = [r for r in await engine.jobs(name) if r["state"] in states]
        return answer({"purged_count": await purge_older(found, body, engine.delete), "states": states})

    async def jobs(request: Request) -> Response:
        return answer(await listed(request, engine.jobs))

    async def job(request: Request) -> Response:
        return answer(admin.detail(await engine.ops.record(request.path_params["job_id"])))

    async def retry(request: Request) -> Response:
        return answer({"job": await engine.retry(request.path_params["job_id"])})

    async def cancel(request: Request) -> Response:
        return answer({"job": await engine.ops.cancel(request.path_params["job_id"])})

    def bulk(action: str, eligible: tuple[str, ...], run, source=engine.jobs, needs_filter=True):
        """Over every job, an empty filter must be said twice (`"all": true`); over the dead letters
        it is the DLQ's "retry all" (what the admin UI sends)."""
        async def handler(request: Request) -> Response:
            body = await body_of(request)
            admin.confirmed(body)
            chosen = Filter.of(body.get("filter"))
            if needs_filter and chosen == Filter() and body.get("all") is not True:
                raise invalid("a bulk action needs a filter (queue, state, type, since, until), "
                              "or \"all\": true to act on every job it may")
            matched = [r for r in chosen.select(await source(chosen.queue, chosen.state)) if r["state"] in eligible]
            errors = []
            for record in matched:
                try:
                    await run(record["id"])
                except OjsError as exc:  # changed by someone else since it was listed
                    errors.append({"job_id": record["id"], "error": exc.message})
            return answer(admin.bulk_result(action, len(matched), errors))
        return handler

    async def dead(queue: str | None = None, state: str | None = None) -> list[dict]:
        return await engine.dead_letters(queue)

    async def dead_letters(request: Request) -> Response:
        return answer(await listed(request, dead))

    async def dead_letter_stats(request: Request) -> Response:
        return answer(admin.dead_letter_stats(Filter.of(request.query_params, strict=False).select(await dead())))

    async def dead_letter_purge(request: Request) -> Response:
        body = await body_of(request)
        admin.confirmed(body)
        return answer({"purged_count": await purge_older(await dead(), body, engine.delete_dead_letter)})

    async def dead_letter_retry(request: Request) -> Response:
        return answer({"job": await engine.retry_dead_letter(request.path_params["job_id"])})

    async def dead_letter_delete(request: Request) -> Response:
        await engine.delete_dead_letter(request.path_params["job_id"])
        return Response(status_code=204)

    async def workers(request: Request) -> Response:
        rows, summary = engine.workers.listing(utcnow())
        running = Counter(r.get("worker_id") for r in await engine.jobs(state="active"))
        for row in rows:  # what the records say it holds, not what its last heartbeat said
            row["active_jobs"] = running[row["id"]]
        return answer({**admin.paged(rows, request.query_params), "summary": summary, "scope": SCOPE})

    def _worker(worker_id: str):
        found = engine.workers.known.get(worker_id)
        if found is None:
            raise OjsError(404, "not_found", f"worker {worker_id} has not been seen by this server")
        return found

    async def worker(request: Request) -> Response:
        found = _worker(request.path_params["worker_id"])
        active = [admin.summary(r) for r in await engine.jobs(state="active") if r.get("worker_id") == found.id]
        return answer({**found.public(utcnow()), "jobs": active})

    async def quiet(request: Request) -> Response:
        found = _worker(request.path_params["worker_id"])
        engine.workers.ask(found.id, "quiet")
        return answer(found.public(utcnow()))

    async def deregister(request: Request) -> Response:
        found = _worker(request.path_params["worker_id"])
        if found.state(utcnow()) != "stale":
            raise OjsError(409, "conflict", f"worker {found.id} is {found.state(utcnow())}: only a stale worker "
                                            "(no contact for 60 s) can be deregistered; quiet it first")
        released = await engine.release_worker(found.id)
        del engine.workers.known[found.id]
        return answer({"deregistered": True, "id": found.id, "released_jobs": released})

    async def purge_older(records: list[dict], body: dict, delete) -> int:
        """Delete the finished `records` that ended before the body's `older_than` (all without one)."""
        until = Filter.of({"until": body.get("older_than")}).until
        purged = 0
        for record in records:
            ended = record.get("completed_at") or record.get("cancelled_at") or record.get("discarded_at")
            if until is None or (ended and ended < iso(until)):
                await delete(record["id"])
                purged += 1
        return purged

    prefix = "/ojs/v1/admin"
    return [
        Route(f"{prefix}/stats", stats, methods=["GET"]),
        Route(f"{prefix}/stats/history", history, methods=["GET"]),
        Route(f"{prefix}/queues", queues, methods=["GET"]),
        Route(f"{prefix}/queues/{{name}}", queue, methods=["GET"]),
        Route(f"{prefix}/queues/{{name}}/pause", pause, methods=["POST"]),
        Route(f"{prefix}/queues/{{name}}/config", config, methods=["GET"]),
        Route(f"{prefix}/queues/{{name}}/resume", resume, methods=["POST"]),
        Route(f"{prefix}/queues/{{name}}/jobs", purge, methods=["DELETE"]),
        Route(f"{prefix}/queues/{{name}}/config", configure, methods=["PUT"]),
        Route(f"{prefix}/jobs", jobs, methods=["GET"]),
        Route(f"{prefix}/jobs/bulk/retry", bulk("retry", (State.DISCARDED, State.CANCELLED), engine.retry), methods=["POST"]),
        Route(f"{prefix}/jobs/bulk/cancel", bulk("cancel", tuple(s for s in STATES if s not in FINISHED),
                                                 engine.ops.cancel), methods=["POST"]),
        Route(f"{prefix}/jobs/bulk/delete", bulk("delete", tuple(FINISHED), engine.delete), methods=["POST"]),
        Route(f"{prefix}/jobs/{{job_id}}", job, methods=["GET"]),
        Route(f"{prefix}/jobs/{{job_id}}/retry", retry, methods=["POST"]),
        Route(f"{prefix}/jobs/{{job_id}}/cancel", cancel, methods=["POST"]),
        Route(f"{prefix}/dead-letter", dead_letters, methods=["GET"]),
        Route(f"{prefix}/dead-letter", dead_letter_purge, methods=["DELETE"]),
        Route(f"{prefix}/dead-letter/stats", dead_letter_stats, methods=["GET"]),
        Route(f"{prefix}/dead-letter/retry", bulk("retry", ("discarded",), engine.retry_dead_letter, dead, False),
              methods=["POST"]),
        Route(f"{prefix}/dead-letter/{{job_id}}", dead_letter_delete, methods=["DELETE"]),
        Route(f"{prefix}/dead-letter/{{job_id}}/retry", dead_letter_retry, methods=["POST"]),
        Route(f"{prefix}/workers", workers, methods=["GET"]),
        Route(f"{prefix}/workers/{{worker_id}}", worker, methods=["GET"]),
        Route(f"{prefix}/workers/{{worker_id}}", deregister, methods=["DELETE"]),
        Route(f"{prefix}/workers/{{worker_id}}/quiet", quiet, methods=["POST"]),
    ]
