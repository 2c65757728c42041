"""Job functions by job type, so one worker process runs many kinds of job (as Celery and
procrastinate route tasks by name):

    jobs = JobHandlers()

    @jobs.handler("email.send")
    async def send_email(to, subject, *, job):   # `job` (the envelope) is optional
        ...                                      # as is `checkpoint` (seamq.jobs.durable)

`seamq jobs worker --handler app.tasks:jobs` runs them; `--handler
email.send=app.mail:send_email` adds one by hand; a plain `--handler
app.mail:send_email` takes every type (the catch-all, `*`).
"""

from __future__ import annotations

import inspect
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Callable

from seamq.model import ErrorCode, SeamqError

ANY = "*"


@dataclass(frozen=True)
class Handler:
    function: Callable
    in_thread: bool  # a sync function runs in a thread, which cannot be cancelled once it runs
    passes_job: bool
    passes_checkpoint: bool = False

    @classmethod
    def of(cls, function: Callable) -> "Handler":
        if not callable(function):
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{function!r} is not a function")
        named = inspect.signature(function).parameters
        return cls(function, not inspect.iscoroutinefunction(function), "job" in named, "checkpoint" in named)


class RateLimited(Exception):
    """Raised by a job function that met a downstream limit (a partner's 429): the attempt fails as any
    error does, and the job's rate limit key (`options.rate_limit`) starts none of its jobs before `until`."""

    def __init__(self, message: str, until: datetime) -> None:
        super().__init__(message)
        self.rate_limit_until = until if until.tzinfo else until.replace(tzinfo=timezone.utc)


class UnknownJobType(Exception):
    """A job no function here is registered for. Retried by its policy rather than discarded: in a
    rolling deploy an older worker meets a type that the newer ones handle."""


class JobHandlers:
    def __init__(self) -> None:
        self.by_type: dict[str, Handler] = {}

    def add(self, job_type: str, function: Callable) -> None:
        if job_type in self.by_type:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"two functions for job type {job_type!r}: "
                                                       f"{self.by_type[job_type].function.__qualname__} and "
                                                       f"{getattr(function, '__qualname__', function)}")
        self.by_type[job_type] = Handler.of(function)

    def handler(self, job_type: str) -> Callable[[Callable], Callable]:
        def register(function: Callable) -> Callable:
            self.add(job_type, function)
            return function
        return register

    def merge(self, other: "JobHandlers") -> None:
        for job_type, handler in other.by_type.items():
            self.add(job_type, handler.function)

    def route(self, job_type: str) -> Handler:
        found = self.by_type.get(job_type) or self.by_type.get(ANY)
        if found is None:
            known = ", ".join(sorted(self.by_type)) or "none"
            raise UnknownJobType(f"no function for job type {job_type!r} in this worker (it runs: {known})")
        return found

    @classmethod
    def of(cls, given: "JobHandlers | Callable") -> "JobHandlers":
        if isinstance(given, JobHandlers):
            return given
        handlers = cls()
        handlers.add(ANY, given)
        return handlers
