"""The console's pages for jobs, through the job server's admin API (the same calls `seamq jobs`
makes): queues with their counts and pause/resume, a job search, a job with its errors and
retry/cancel, dead jobs, cron jobs and workflows. Each action is recorded like a dead letter's."""

from __future__ import annotations

from datetime import datetime, timezone

from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from seamq.console.app import Console, Ctx
from seamq.dlq_desk import DeadLetterDesk
from seamq.jobs.client import JobsClient
from seamq.model import ErrorCode, SeamqError

STATES = ("scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded")


def routes(console: Console, desk: DeadLetterDesk, jobs: JobsClient) -> list[Route]:
    async def queues(ctx: Ctx) -> Response:
        filters = {name: ctx.one(name).strip() for name in ("state", "type", "queue", "since", "until")}
        if filters["state"] and filters["state"] not in STATES:
            raise SeamqError(ErrorCode.INVALID_INPUT, f"state {filters['state'][:40]!r} is not one of "
                                                      f"{', '.join(STATES)}")
        chosen = {name: value for name, value in filters.items() if value}
        for name in ("since", "until"):  # a browser's datetime-local has no zone: the console's times are UTC
            if name in chosen:
                chosen[name] = _utc(name, chosen[name])
        found = await jobs.jobs(limit=200, **chosen) if chosen else None
        return console.render("jobs.html", ctx, queues=await jobs.queues(), found=found, states=STATES,
                              dead=await jobs.jobs(dead_letters=True, limit=200), filters=filters)

    async def job(ctx: Ctx) -> Response:
        return console.render("job.html", ctx, job=await jobs.job(ctx.request.path_params["job_id"]))

    async def retry(ctx: Ctx) -> Response:
        job_id = ctx.request.path_params["job_id"]
        dead = ctx.one("dead") == "1"
        async with desk.recorded(ctx.actor, "jobs.retry", [], job_id=job_id) as record:
            await jobs.retry(job_id, dead_letter=dead)
            record.done = 1
        return RedirectResponse(f"/jobs/{job_id}", 303)

    async def cancel(ctx: Ctx) -> Response:
        job_id = ctx.request.path_params["job_id"]
        async with desk.recorded(ctx.actor, "jobs.cancel", [], job_id=job_id) as record:
            await jobs.cancel(job_id)
            record.done = 1
        return RedirectResponse(f"/jobs/{job_id}", 303)

    async def pause(ctx: Ctx) -> Response:
        name, switch = ctx.request.path_params["name"], ctx.request.path_params["switch"]
        if switch not in ("pause", "resume"):
            raise SeamqError(ErrorCode.NOT_FOUND, f"a queue can be paused or resumed, not {switch[:40]!r}")
        paused = switch == "pause"
        async with desk.recorded(ctx.actor, f"jobs.{'pause' if paused else 'resume'}", [], queue=name) as record:
            await jobs.pause(name, paused)
            record.done = 1
        return RedirectResponse("/jobs", 303)

    async def scheduled(ctx: Ctx) -> Response:
        return console.render("jobs_more.html", ctx, crons=await jobs.crons(), workflows=await jobs.workflows(),
                              webhooks=await jobs.webhooks(), limits=await jobs.rate_limits(),
                              tenants=await jobs.tenants())

    return [
        Route("/jobs", console.page(queues)),
        Route("/jobs/cron-and-workflows", console.page(scheduled)),
        Route("/jobs/queues/{name}/{switch:str}", console.page(pause, action=True), methods=["POST"]),
        Route("/jobs/{job_id}", console.page(job)),
        Route("/jobs/{job_id}/retry", console.page(retry, action=True), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", console.page(cancel, action=True), methods=["POST"]),
    ]


def _utc(name: str, value: str) -> str:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise SeamqError(ErrorCode.INVALID_INPUT, f"{name}: {value[:40]!r} is not a time (2026-11-26T08:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).isoformat()
