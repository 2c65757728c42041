"""A job's clocks, the part of seamq.jobs.operations that timers drive: a timer is armed in the store
(it fires once, to one server, whatever dies) and, when due soon, also kept by the server that armed
it, so it fires on time; when it fires, the job moves only if the timer still applies.
"""

from __future__ import annotations

from datetime import datetime

from seamq.jobs import job as J
from seamq.jobs.model import OjsError
from seamq.jobs.ports import Fired


class JobClocks:
    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None:
        """In the store (fires once, to one server, whatever dies); if due soon, also here, on time."""
        await self.store.arm(kind, key, at, token)
        self.soon(kind, key, at, token)

    async def fire(self, fired: Fired) -> bool:
        """A job's timer came due (to this server alone): move the job if the timer still applies.
        False when the change it was armed for is not stored yet (timers are armed first): it is
        then handed out again a little later, a few times, and dropped if that change never came."""
        held = await self.store.get(fired.key.rsplit(".", 1)[-1])
        attempt = fired.token.get("attempt")
        if held is None:
            return fired.kind not in ("scheduled", "expire")  # a push not stored yet, or never
        job, revision = J.from_record(held[0]), held[1]
        if (fired.kind == "retry" and job.state == J.State.ACTIVE and job.attempt == attempt) or \
                (fired.kind == "timeout" and job.state == J.State.AVAILABLE and job.attempt + 1 == attempt):
            return False  # the failure, or the claim, not stored yet
        if attempt == job.attempt:
            await self._due(fired.kind, job, revision)
        return True

    async def _due(self, kind: str, job: J.Job, revision: int) -> None:
        now = self.clock()
        try:
            if kind in ("scheduled", "retry") and job.state in (J.State.SCHEDULED, J.State.RETRYABLE):
                await self._store(J.due(job, now), revision, job)
            elif kind == "expire" and job.state in J.WAITING:
                expired = J.expired(job, now)
                await self._store(expired, revision, job)
                await self.events.emit("job.expired", J.to_record(expired))
            elif kind == "timeout" and job.state == J.State.ACTIVE:
                error = {"code": "timeout", "type": "timeout", "message": f"exceeded timeout_ms={job.timeout_ms}"}
                failed = J.failed(job, now, error, self.rng)
                await self._failed(failed, (await self._store(failed, revision, job))[1])
        except OjsError:  # another server or request moved it first: the timer no longer applies
            pass
