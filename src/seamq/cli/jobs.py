"""`seamq jobs`: the Open Job Spec job server (docs/jobs.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import typer
from rich.table import Table

from seamq.cli.common import JsonOption, console, exit_with, id_prefix, print_json, run, settings, the_one
from seamq.jobs import tenants
from seamq.jobs.model import FINISHED
from seamq.jobs.sealing import Keys
from seamq.model import ErrorCode, SeamqError, describe

app = typer.Typer(help="Open Job Spec job server on NATS JetStream + KV.", no_args_is_help=True)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, help="Port to listen on."),
    test_mode: bool = typer.Option(False, "--test-mode",
                                   help="Conformance testing only: POST /ojs/v1/admin/reset empties every job, "
                                        "and heartbeats honour options.metadata.test_directive."),
    admin_ui: Optional[Path] = typer.Option(None, "--admin-ui", help="A build of the official OJS admin UI "
                                            "(its dist-app folder) to serve at /ojs/admin/ (docs/jobs.md)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Listen beyond loopback with no token configured "
                                                          "(anyone who reaches the port can change jobs)."),
) -> None:
    """Serve OJS 1.0 under /ojs/v1 until SIGTERM (NATS from SEAMQ_NATS__*)."""
    from seamq.jobs.serve import serve as serve_jobs

    if admin_ui is not None and not (admin_ui / "index.html").is_file():
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--admin-ui {admin_ui}: no index.html there; point it "
                                                       "at the admin UI's build (dist-app), see docs/jobs.md"))
    current = settings()
    if host not in LOOPBACK and not (current.jobs.tokens or current.jobs.read_tokens) and not no_auth:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--host {host} with no token: anyone who reaches the port "
                             "could enqueue, cancel and purge jobs. Set SEAMQ_JOBS__TOKENS (docs/jobs.md, "
                             "\"Authentication\"), or pass --no-auth behind a proxy that authenticates"))
    run(serve_jobs(current, host=host, port=port, test_mode=test_mode, admin_ui=admin_ui))


@app.command()
def worker(
    url: str = typer.Option("", help="The OJS server, e.g. http://127.0.0.1:8080. Or --nats."),
    nats: bool = typer.Option(False, "--nats", help="No job server: run the engine in this process, on the NATS "
                                                    "of SEAMQ_NATS__* (the server's rules; no HTTP hop)."),
    queue: list[str] = typer.Option(..., "--queue", "-q", help="Queue to take jobs from (repeat for several, "
                                                                "in order of preference)."),
    handler: list[str] = typer.Option(..., help="Job functions: package.module:jobs (a JobHandlers, routed by job "
                                                "type), type=package.module:function for one type, or "
                                                "package.module:function for every type. Repeat for several. "
                                                "Called with the job's args, and job=<envelope> if they take it."),
    concurrency: int = typer.Option(10, min=1, max=1000, help="Jobs run at once."),
    visibility_timeout: float = typer.Option(60.0, min=1.0, help="Seconds a job stays leased to this worker "
                                                                  "without a heartbeat (it heartbeats every quarter)."),
    grace: float = typer.Option(25.0, min=0.0, help="On SIGTERM, seconds running jobs get to finish before they "
                                                    "are released to other workers."),
    worker_id: str = typer.Option("", help="Name in the server's records (default: host-pid)."),
    tenant: Optional[str] = typer.Option(None, help="Run this tenant's jobs alone (X-OJS-Tenant; _default for "
                                                    "jobs of none). Default: every tenant's, each in turn."),
) -> None:
    """Run jobs through Python functions by job type until SIGTERM: ack on return, nack with the exception."""
    from seamq.jobs.worker import WorkerConfig, run_worker

    try:
        if bool(url) == nats:
            raise SeamqError(ErrorCode.INVALID_CONFIG, "give the job server (--url URL) or --nats, one of them")
        handlers = _handlers(handler)
        if tenant is not None and tenant != "_default" and not tenants.PATTERN.fullmatch(tenant):
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"--tenant must match {tenants.PATTERN.pattern}")
        keys = _keys()
    except SeamqError as exc:
        exit_with(exc)
    config = WorkerConfig(queues=tuple(queue), concurrency=concurrency, visibility_timeout=visibility_timeout,
                          grace=grace, worker_id=worker_id, tenant=tenant, keys=keys)
    if nats:
        from seamq.jobs.native import run_native_worker

        run(run_native_worker(settings(), handlers, config))
    else:
        run(run_worker(url, handlers, config, settings().jobs.client_token()))


def _keys() -> Keys | None:
    """SEAMQ_JOBS__ENCRYPTION_KEYS, to open jobs their clients sealed (seamq.jobs.sealing)."""
    given = settings().jobs.encryption_keys
    try:
        return Keys.parse(given.get_secret_value()) if given else None
    except ValueError as exc:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"SEAMQ_JOBS__ENCRYPTION_KEYS: {exc}") from None


def _handlers(given: list[str]):
    from seamq.jobs.handlers import ANY, JobHandlers
    from seamq.registry import import_object

    handlers = JobHandlers()
    for text in given:
        job_type, _, target = text.rpartition("=")
        found = import_object(target)
        if isinstance(found, JobHandlers) and not job_type:
            handlers.merge(found)
        elif callable(found):
            handlers.add(job_type or ANY, found)
        else:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"--handler {text}: {target} is neither a function nor a "
                                                       "JobHandlers (seamq.jobs.handlers)")
    return handlers


# ---- operators: list, show, retry, cancel (through the server's admin API) ----------------------

Url = typer.Option(None, "--url", help="The job server (default: SEAMQ_JOBS__URL, http://127.0.0.1:8080).")
LOOPBACK = ("127.0.0.1", "::1", "localhost")
Queue = typer.Option(None, "--queue", "-q", help="Only jobs of this queue.")
State = typer.Option(None, "--state", help="Only jobs in this state (available, active, discarded, ...).")
JobType = typer.Option(None, "--type", help="Only this job type, or a prefix ending in * (email.*).")
Since = typer.Option(None, "--since", help="Only jobs created at or after this RFC 3339 time.")
Dead = typer.Option(False, "--dead-letters", help="Dead letters only (jobs discarded with on_exhaustion: dead_letter).")


def _admin(url: str | None, call):
    """Run `call(client)` against the job server; its refusals and absence as seamq's coded errors."""
    import aiohttp

    from seamq.jobs.client import JobsClient, JobsError

    current = settings().jobs
    url = url or current.url
    if urlsplit(url.strip()).scheme not in ("http", "https"):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"--url {url!r} is not an http:// or https:// URL "
                                                       "(e.g. http://127.0.0.1:8080)"))

    async def go():
        async with JobsClient(url, retries=1, token=current.client_token()) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except JobsError as exc:
        exit_with(exc.coded())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        exit_with(SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"cannot reach the job server at {url}: "
                                                           f"{describe(exc)} (check --url or SEAMQ_JOBS__URL)"))


@app.command("list")
def list_(url: Optional[str] = Url, queue: Optional[str] = Queue, state: Optional[str] = State, job_type: Optional[str] = JobType,
          since: Optional[str] = Since, dead_letters: bool = Dead,
          limit: int = typer.Option(100, "--limit", min=1, help="At most this many (oldest first)."),
          as_json: bool = JsonOption) -> None:
    """Jobs the server holds (finished ones for their retention period), oldest first."""
    rows = _admin(url, lambda c: c.jobs(dead_letters=dead_letters, limit=limit, queue=queue, state=state,
                                        type=job_type, since=since))
    if as_json:
        return print_json(rows)
    table = Table(title=f"{len(rows)} {'dead letters' if dead_letters else 'jobs'}")
    for name in ("id", "type", "queue", "state", "attempt", "created", "last error"):
        table.add_column(name, overflow="fold", no_wrap=name == "id")  # an id on two lines cannot be copied
    for row in rows:
        error = row.get("error") or {}
        table.add_row(row["id"], row["type"], row["queue"], row["state"], f"{row['attempt']}/{row['max_attempts']}",
                      row["created_at"][:19].replace("T", " "),
                      f"{error.get('type', '')}: {error.get('message', '')}" if error else "")
    console.print(table)


@app.command()
def show(job_id: str = typer.Argument(..., help="The job's id."), url: Optional[str] = Url, as_json: bool = JsonOption) -> None:
    """One job: its envelope, its moments, and every failed attempt with its trace."""
    job_id = _job_id(url, job_id)
    job = _admin(url, lambda c: c.job(job_id))
    if as_json:
        return print_json(job)
    table = Table("field", "value", title=f"job {job['id']}", show_header=False)
    for key in ("type", "queue", "state", "priority", "attempt", "max_attempts", "worker_id"):
        if job.get(key) is not None:
            table.add_row(key, str(job[key]))
    if job.get("dead_letter"):
        table.add_row("dead letter", f"yes: it waits in the dead letters (seamq jobs retry {job['id']} --dead-letters)")
    for key, value in job["metadata"].items():
        if value:
            table.add_row(key, value)
    table.add_row("args", json.dumps(job.get("args"), ensure_ascii=False)[:2000])
    if job.get("result") is not None:
        table.add_row("result", json.dumps(job["result"], ensure_ascii=False)[:2000])
    for error in job["errors"]:
        lines = error.get("backtrace", [])
        cut = len(lines) - TRACE_LINES
        trace = "\n".join(([f"... {cut} lines before these (--json shows them)"] if cut > 0 else []) + lines[-TRACE_LINES:])
        table.add_row(f"attempt {error['attempt']}", f"{error['occurred_at']}  {error.get('type')}: {error['message']}"
                      + (f"\n{trace}" if trace else ""))
    console.print(table)


def _job_id(url: str | None, value: str, dead_letters: bool = False) -> str:
    """A job id, or its start (4 characters at least), as `seamq dlq` takes message ids."""
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        prefix = id_prefix(value, "job id")
    found = _admin(url, lambda c: c.jobs(dead_letters=dead_letters, limit=6, id=prefix))
    return the_one((job["id"] for job in found), value, "dead-lettered job" if dead_letters else "job")


TRACE_LINES = 40  # of a failed attempt's trace, shown from its end: where it failed, and what called it


def _one_or_all(action: str, job_id, all_, filters: dict) -> None:
    if bool(job_id) == all_:
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, f"give one job id, or --all (with optional filters) to {action}"))
    if job_id and any(v is not None for v in filters.values()):
        exit_with(SeamqError(ErrorCode.INVALID_CONFIG, "filters go with --all, not with one job id"))


def _bulk_report(done: str, result: dict, as_json: bool) -> None:
    if as_json:
        print_json(result)
    else:
        console.print(f"{done} {result['succeeded']} of {result['matched']} selected jobs")
        for error in result["errors"]:
            console.print(f"  {error['job_id']}: {error['error']}", highlight=False)
    if result["failed"]:
        raise typer.Exit(1)


@app.command()
def retry(job_id: Optional[str] = typer.Argument(None, help="One discarded or cancelled job; or --all."),
          all_: bool = typer.Option(False, "--all", help="Every discarded or cancelled job the filters select."),
          url: Optional[str] = Url, queue: Optional[str] = Queue, state: Optional[str] = State,
          job_type: Optional[str] = JobType, since: Optional[str] = Since, dead_letters: bool = Dead,
          as_json: bool = JsonOption) -> None:
    """Run discarded or cancelled jobs (or dead letters) again: available now, attempt 0, errors kept."""
    filters = {"queue": queue, "state": state, "type": job_type, "since": since}
    _one_or_all("retry", job_id, all_, filters)
    if job_id:
        job_id = _job_id(url, job_id, dead_letters)
        job = _admin(url, lambda c: c.retry(job_id, dead_letter=dead_letters))
        return print_json(job) if as_json else console.print(f"job {job['id']} is {job['state']} again")
    _bulk_report("retried", _admin(url, lambda c: c.bulk("retry", filters, dead_letters=dead_letters)), as_json)


@app.command()
def cancel(job_id: Optional[str] = typer.Argument(None, help="One job not yet finished; or --all."),
           all_: bool = typer.Option(False, "--all", help="Every unfinished job the filters select."),
           yes: bool = typer.Option(False, "--yes", help="Really cancel every job --all selects."),
           url: Optional[str] = Url, queue: Optional[str] = Queue, state: Optional[str] = State,
           job_type: Optional[str] = JobType, since: Optional[str] = Since, as_json: bool = JsonOption) -> None:
    """Cancel jobs: waiting ones never run; a running one's worker is told at its next heartbeat."""
    filters = {"queue": queue, "state": state, "type": job_type, "since": since}
    _one_or_all("cancel", job_id, all_, filters)
    if job_id:
        job_id = _job_id(url, job_id)
        job = _admin(url, lambda c: c.cancel(job_id))
        return print_json(job) if as_json else console.print(f"job {job['id']} is {job['state']}")
    if not yes:  # what the bulk cancel would act on: the unfinished jobs among those the filters select
        selected = _admin(url, lambda c: c.jobs(limit=100_000, **filters))
        count = sum(1 for job in selected if job["state"] not in FINISHED)
        exit_with(SeamqError(ErrorCode.CONFIRMATION_NEEDED, f"--all selects {count} unfinished jobs now; add --yes "
                                                            "to cancel them"))
    _bulk_report("cancelled", _admin(url, lambda c: c.bulk("cancel", filters)), as_json)
