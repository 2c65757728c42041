"""A Python client of any OJS 1.0 server (ours or another): push jobs, and the worker protocol.

    async with JobsClient("http://127.0.0.1:8080") as jobs:
        job = await jobs.push("email.send", ["ada@example.com"], queue="mail")

Every answer is the server's JSON; an error answer raises `JobsError` with the
OJS error code, so a caller can tell a duplicate (409) from a bad job (400).
Transport failures are retried a few times for the calls that are safe to
repeat (fetch is not: a lost answer would lease jobs nobody runs until their
visibility timeout).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from seamq.backoff import Backoff
from seamq.jobs import sealing
from seamq.jobs.attempts import MAY_WAIT_HEADER, MAY_WAIT_MOST_MS
from seamq.jobs.sealing import Keys
from seamq.http import CLIENT_IDLE
from seamq.model import ErrorCode, SeamqError

MEDIA_TYPE = "application/openjobspec+json"
RECONNECT = Backoff(base=0.4, cap=5.0)  # a request the server did not answer: many clients, not at once


class JobsError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.details = details if isinstance(details, dict) else {}

    def coded(self) -> SeamqError:
        """This answer as seamq's coded error, for the CLI and the console alike: no such job, input
        the server refused, a token it does not take, or a job whose state does not allow it."""
        code = {404: ErrorCode.NOT_FOUND, 400: ErrorCode.INVALID_INPUT, 422: ErrorCode.INVALID_INPUT,
                401: ErrorCode.INVALID_CONFIG, 403: ErrorCode.INVALID_CONFIG}.get(self.status, ErrorCode.JOB_REFUSED)
        hint = " (set SEAMQ_JOBS__TOKENS to a token the server knows)" if self.status in (401, 403) else ""
        return SeamqError(code, f"the job server answered {self.status} {self.code}: {self.message}{hint}")


class JobsClient:
    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, token: str | None = None,
                 keys: Keys | None = None) -> None:
        """`token`: a bearer token, when the server asks for one (SEAMQ_JOBS__TOKENS). `keys`: seal the
        args of every job pushed (seamq.jobs.sealing: the server never sees them)."""
        self.url = url.rstrip("/") + "/ojs/v1"
        self.retries, self.keys = retries, keys
        headers = {"Content-Type": MEDIA_TYPE, "Accept": MEDIA_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=headers,
                                              connector=aiohttp.TCPConnector(keepalive_timeout=CLIENT_IDLE))

    async def __aenter__(self) -> "JobsClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    # ---- producers ------------------------------------------------------------------------------

    async def health(self) -> dict:
        return await self._call("GET", "/health")

    async def push(self, type: str, args: list | None = None, *, queue: str | None = None,
                   options: dict | None = None, **fields: Any) -> dict:
        """Enqueue one job; `options` as OJS defines them (priority, scheduled_at, retry, unique, ...)."""
        return (await self._call("POST", "/jobs", self._sealed(_job(type, args, queue, options, fields))))["job"]

    async def push_batch(self, jobs: list[dict]) -> list[dict]:
        """Enqueue up to 1000 jobs (push bodies) at once: all of them or, on any error, none."""
        return (await self._call("POST", "/jobs/batch", {"jobs": [self._sealed(job) for job in jobs]}))["jobs"]

    def _sealed(self, body: dict) -> dict:
        return sealing.sealed(body, self.keys) if self.keys is not None else body

    async def info(self, job_id: str) -> dict:
        return (await self._call("GET", f"/jobs/{job_id}"))["job"]

    async def cancel(self, job_id: str) -> dict:
        return (await self._call("DELETE", f"/jobs/{job_id}"))["job"]

    # ---- workers --------------------------------------------------------------------------------

    async def fetch(self, queues: list[str], *, count: int = 1, worker_id: str | None = None,
                    visibility_timeout_ms: int | None = None, tenant: str | None = None) -> list[dict]:
        """`tenant`: that tenant's jobs alone (X-OJS-Tenant); else every tenant's, in turn."""
        body = {"queues": queues, "count": count, "worker_id": worker_id}
        if visibility_timeout_ms:
            body["visibility_timeout_ms"] = visibility_timeout_ms
        headers = {"X-OJS-Tenant": tenant} if tenant is not None else None
        return (await self._call("POST", "/workers/fetch", body, retry=False, headers=headers))["jobs"]

    async def ack(self, job_id: str, result: Any = None, *, may_wait: float = 0.0) -> dict:
        """`may_wait`: seconds (50 ms at most) the server may hold it to store it with others (a worker
        that does not wait on its acks; a seamq server, X-Seamq-May-Wait)."""
        return await self._call("POST", "/workers/ack", {"job_id": job_id, "result": result},
                                headers=_waits(may_wait))

    async def nack(self, job_id: str, error: BaseException | dict | str, *, requeue: bool = False,
                   may_wait: float = 0.0) -> dict:
        """Fail the job's attempt: retried by its policy, or released unchanged with `requeue`."""
        return await self._call("POST", "/workers/nack", {"job_id": job_id, "error": error_body(error),
                                                          "requeue": requeue}, headers=_waits(may_wait))

    async def beat(self, worker_id: str, state: str, active_jobs: int) -> dict:
        """Say this worker's state (graceful shutdown: quiet, drain, terminate); said once, not retried."""
        return await self._call("POST", "/workers/beat", {"worker_id": worker_id, "state": state,
                                                          "active_jobs": active_jobs}, retry=False)

    async def save_checkpoint(self, job_id: str, state: Any, *, worker_id: str | None = None) -> dict:
        return await self._call("PUT", f"/jobs/{job_id}/checkpoint", {"state": state, "worker_id": worker_id})

    async def delete_checkpoint(self, job_id: str) -> dict:
        return await self._call("DELETE", f"/jobs/{job_id}/checkpoint")

    async def heartbeat(self, worker_id: str, active_jobs: list[str], *,
                        visibility_timeout_ms: int | None = None) -> dict:
        body = {"worker_id": worker_id, "active_jobs": active_jobs}
        if visibility_timeout_ms:
            body["visibility_timeout_ms"] = visibility_timeout_ms
        return await self._call("POST", "/workers/heartbeat", body)

    # ---- operators: the admin API (urn:ojs:ext:admin-api) ---------------------------------------

    async def jobs(self, *, dead_letters: bool = False, limit: int = 1000, **filters: str | None) -> list[dict]:
        """Jobs (or dead letters) matching `queue`, `state`, `type`, `since`, `until`, oldest first."""
        path = "/admin/dead-letter" if dead_letters else "/admin/jobs"
        params = {k: v for k, v in filters.items() if v is not None}
        out: list[dict] = []
        page = 1
        while len(out) < limit:  # oldest first: jobs that arrive while paging join the last page
            query = urlencode({**params, "sort": "created_at", "order": "asc", "page": page, "per_page": 100})
            answer = await self._call("GET", f"{path}?{query}")
            out.extend(answer["items"])
            if not answer["items"] or page * 100 >= answer["pagination"]["total"]:
                break
            page += 1
        return out[:limit]

    async def rate_limit(self, key: str) -> dict:
        """A rate limit key as it stands: its limits, the jobs it lets run now, the starts in its window."""
        return await self._call("GET", f"/rate-limits/{key}")

    async def tenants(self) -> list[dict]:
        """Every tenant with its counts (a pass over the tallies: for an operator's page, not a loop)."""
        return (await self._call("GET", "/admin/tenants?per_page=200"))["items"]

    async def tenant(self, tenant_id: str) -> dict:
        """A tenant's counts, in all and in each queue that holds or held its jobs."""
        return await self._call("GET", f"/admin/tenants/{quote(tenant_id, safe='')}/stats")

    async def queues(self) -> list[dict]:
        """Every queue with its counts by state and whether it is paused."""
        return (await self._call("GET", "/admin/queues?per_page=1000"))["items"]

    async def pause(self, queue: str, paused: bool = True) -> dict:
        return await self._call("POST", f"/admin/queues/{quote(queue, safe='')}/{'pause' if paused else 'resume'}")

    async def crons(self) -> list[dict]:
        return (await self._call("GET", "/crons?per_page=1000"))["items"]

    async def webhooks(self) -> list[dict]:
        """Each webhook subscription with its latest deliveries (`deliveries`, newest first)."""
        found = (await self._call("GET", "/webhooks/subscriptions"))["subscriptions"]
        for subscription in found:
            subscription["deliveries"] = (await self._call(
                "GET", f"/webhooks/subscriptions/{quote(subscription['id'], safe='')}/deliveries"))["deliveries"][:20]
        return found

    async def rate_limits(self) -> list[dict]:
        """Every rate limit key as it stands (and the queues' own rates)."""
        return (await self._call("GET", "/rate-limits?per_page=200"))["items"]

    async def workflows(self) -> list[dict]:
        return (await self._call("GET", "/workflows?per_page=200"))["items"]

    async def job(self, job_id: str) -> dict:
        """The whole job, with every failed attempt (`errors`)."""
        return await self._call("GET", f"/admin/jobs/{quote(job_id, safe='')}")

    async def retry(self, job_id: str, *, dead_letter: bool = False) -> dict:
        path = f"/admin/dead-letter/{quote(job_id, safe='')}/retry" if dead_letter else \
            f"/admin/jobs/{quote(job_id, safe='')}/retry"
        return (await self._call("POST", path))["job"]

    async def bulk(self, action: str, filters: dict, *, dead_letters: bool = False) -> dict:
        """`retry` or `cancel` every job the filters select (an empty filter: every one it may):
        `{matched, succeeded, failed, errors}`."""
        path = "/admin/dead-letter/retry" if dead_letters else f"/admin/jobs/bulk/{action}"
        chosen = {k: v for k, v in filters.items() if v is not None}
        return await self._call("POST", path, {"filter": chosen, "confirm": True, "all": not chosen}, retry=False)

    # ---- the wire ---------------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Any = None, *, retry: bool = True,
                    headers: dict[str, str] | None = None) -> dict:
        attempts = self.retries if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                async with self._session.request(method, self.url + path, json=body, headers=headers) as response:
                    try:
                        answer = await response.json(content_type=None)
                    except ValueError:
                        answer = None
                    if not isinstance(answer, dict):  # not an OJS server's answer (an HTML error page, say)
                        reason = f" ({response.reason})" if response.reason else ""
                        raise JobsError(response.status, "invalid_response", f"the answer is not a JSON object{reason}")
                    if response.status >= 400:
                        error = answer.get("error")
                        error = error if isinstance(error, dict) else {}
                        raise JobsError(response.status, str(error.get("code", "error")),
                                        str(error.get("message", response.reason or "")), error.get("details"))
                    return answer
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                if attempt == attempts:
                    raise
                await asyncio.sleep(RECONNECT.delay(attempt))
        raise AssertionError("unreachable")


def _job(type: str, args: list | None, queue: str | None, options: dict | None, fields: dict) -> dict:
    options = dict(options or {})
    if queue:
        options["queue"] = queue
    body = {"type": type, "args": list(args or []), **fields}
    if options:
        body["options"] = options
    return body


def error_body(error: BaseException | dict | str) -> dict:
    """A nack's error object; an exception's class becomes `type` (what `non_retryable_errors` match)."""
    if isinstance(error, dict):
        return error
    if isinstance(error, BaseException):
        kind = type(error)
        name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
        body = {"code": "handler_error", "type": name, "message": str(error) or name,
                "retryable": not getattr(error, "non_retryable", False)}
        until = getattr(error, "rate_limit_until", None)  # seamq.jobs.RateLimited: its key waits until then
        return {**body, "rate_limit_until": until.isoformat()} if isinstance(until, datetime) else body
    return {"code": "handler_error", "message": str(error)}


def _waits(may_wait: float) -> dict[str, str] | None:
    return {MAY_WAIT_HEADER: str(round(min(may_wait * 1000, MAY_WAIT_MOST_MS)))} if may_wait > 0 else None
