"""The console's pages for jobs, through the job server's admin API (the same calls `seamq jobs`
makes): queues with their counts and pause/resume, a job search, a job with its errors and
retry/cancel, dead jobs, cron jobs and workflows. Each action is recorded like a dead letter's."""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from seamq.console.app import Console, Ctx
from seamq.dlq_desk import DeadLetterDesk
from seamq.jobs.client import JobsClient
from seamq.model import ErrorCode, SeamqError

STATES = ("scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded")


def routes(console: Console, desk: DeadLetterDesk, jobs: JobsClient) -> list[Route]:
    async def queues(ctx: Ctx) -> Response:
        state, kind, queue = ctx.one("state") or None, ctx.one("type") or None, ctx.one("queue") or None
        if state and state not in STATES:
            raise SeamqError(ErrorCode.INVALID_INPUT, f"state {state[:40]!r} is not one of {', '.join(STATES)}")
        found = await jobs.jobs(state=state, type=kind, queue=queue, limit=200) if (state or kind or queue) else None
        return console.render("jobs.html", ctx, queues=await jobs.queues(), found=found, states=STATES,
                              dead=await jobs.jobs(dead_letters=True, limit=200),
                              filters={"state": state or "", "type": kind or "", "queue": queue or ""})

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
        return console.render("jobs_more.html", ctx, crons=await jobs.crons(), workflows=await jobs.workflows())

    return [
        Route("/jobs", console.page(queues)),
        Route("/jobs/cron-and-workflows", console.page(scheduled)),
        Route("/jobs/queues/{name}/{switch:str}", console.page(pause, action=True), methods=["POST"]),
        Route("/jobs/{job_id}", console.page(job)),
        Route("/jobs/{job_id}/retry", console.page(retry, action=True), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", console.page(cancel, action=True), methods=["POST"]),
    ]
