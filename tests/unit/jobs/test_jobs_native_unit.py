"""seamq.jobs.native's client, on a stand-in engine: an ack or a nack that meets NATS away is said
again, and a refusal is not (the server's answer, as the HTTP client raises it)."""

from __future__ import annotations

from types import SimpleNamespace

import nats.errors
import pytest
from structlog.testing import capture_logs

from seamq.jobs import native
from seamq.jobs.client import JobsError
from seamq.jobs.model import OjsError


class Ops:
    """The engine's ack and nack, failing with the given errors first."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures, self.calls = list(failures), []

    async def ack(self, job_id, result=None, *, may_wait=0.0):
        return self._answer("ack", job_id, may_wait)

    async def nack(self, job_id, error=None, requeue=False, *, may_wait=0.0):
        return self._answer("nack", job_id, may_wait)

    def _answer(self, what: str, job_id: str, may_wait: float) -> dict:
        self.calls.append((what, job_id, may_wait))
        if self.failures:
            raise self.failures.pop(0)
        return {"id": job_id}


async def test_an_ack_met_by_nats_away_is_said_again_and_may_wait_for_the_next_fetch():
    ops = Ops(nats.errors.TimeoutError(), nats.errors.NoRespondersError())
    with capture_logs() as logs:
        assert await native.EngineClient(SimpleNamespace(ops=ops)).ack("j1", {"ok": True}, may_wait=0.05) == {"id": "j1"}
    assert ops.calls == [("ack", "j1", 0.05)] * 3
    assert [(e["event"], e["job_id"], e["attempt"]) for e in logs] == [("job_settle_retrying", "j1", 1),
                                                                       ("job_settle_retrying", "j1", 2)]


async def test_a_refused_nack_is_not_said_again():
    ops = Ops(OjsError(409, "conflict", "cannot fail job j2: it is completed"))
    with pytest.raises(JobsError) as refused:
        await native.EngineClient(SimpleNamespace(ops=ops)).nack("j2", ValueError("boom"))
    assert refused.value.status == 409 and len(ops.calls) == 1


async def test_nats_away_for_longer_than_the_tries_is_said(monkeypatch):
    monkeypatch.setattr(native, "SETTLE_TRIES", 3)
    ops = Ops(*[nats.errors.TimeoutError()] * 4)
    with pytest.raises(nats.errors.TimeoutError):
        await native.EngineClient(SimpleNamespace(ops=ops)).ack("j3")
    assert len(ops.calls) == 3
