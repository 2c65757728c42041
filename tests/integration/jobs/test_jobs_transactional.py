"""Transactional enqueue (seamq.jobs.enqueue): a job written in the caller's database transaction,
relayed from the outbox, taken in by the job server. Rollback: no job; commit: exactly one, with the
relay killed -9 between publishing and marking (twice), on real PostgreSQL, nats-server and servers."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid

import psycopg
import pytest

import seamq.jobs
from seamq.jobs.client import JobsClient
from seamq.model import ErrorCode, SeamqError

from helpers import SEAMQ
from helpers import scalar, wait_for
from helpers.jobs_harness import JobServer

COMMITTED, PER_TX = 2000, 50
# The relay published a batch and waits to mark it (our SHARE lock holds its UPDATE).
MARKING = ("SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'UPDATE outbox_events%%' "
           "AND wait_event_type = 'Lock'")


@pytest.fixture
def server(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()  # it creates OJS_ENQUEUE
    yield server.url
    server.stop()


def relay(env: dict, **settings: str) -> subprocess.Popen:
    return subprocess.Popen([*SEAMQ, "relay"], env={**env, **settings}, stderr=subprocess.DEVNULL)


async def count(client: JobsClient) -> int:
    return len(await client.jobs(limit=100_000))


async def test_rollback_makes_no_job_and_each_driver_commits_one(dsn, provisioned, service_env, server):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    class Abort(Exception):
        pass

    with pytest.raises(Abort), psycopg.connect(dsn) as conn, conn.transaction():
        lost = seamq.jobs.enqueue(conn, "invoice.send", [1], queue="billing")
        raise Abort
    with psycopg.connect(dsn) as conn, conn.transaction():
        by_psycopg = seamq.jobs.enqueue(conn, "invoice.send", [2], queue="billing", priority=5,
                                        retry={"max_attempts": 7}, meta={"order": 2})
    with Session(create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))) as session, session.begin():
        by_sqlalchemy = seamq.jobs.enqueue(session, "invoice.send", [3], queue="billing")
    import asyncpg
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            by_asyncpg = await seamq.jobs.enqueue_async(conn, "invoice.send", [4], queue="billing")
    finally:
        await conn.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(SeamqError) as outside:
            seamq.jobs.enqueue(conn, "invoice.send", [5])
        with pytest.raises(SeamqError) as wrong, conn.transaction():
            seamq.jobs.enqueue(conn, "Invoice Send", [6])
    assert outside.value.code == ErrorCode.NOT_IN_TRANSACTION and wrong.value.code == ErrorCode.INVALID_JOB
    assert scalar(dsn, "SELECT count(*) FROM outbox_events") == 3

    running = relay(service_env)
    try:
        async with JobsClient(server) as client:
            await wait_for(lambda: _at_least(client, 3), what="three jobs")
            jobs = {j["id"]: j for j in await client.jobs()}
            assert sorted(jobs) == sorted([by_psycopg, by_sqlalchemy, by_asyncpg])
            job = await client.info(by_psycopg)
            assert (job["type"], job["queue"], job["priority"], job["args"], job["meta"]) == \
                   ("invoice.send", "billing", 5, [2], {"order": 2}) and job["max_attempts"] == 7
            assert lost not in jobs
    finally:
        running.send_signal(signal.SIGTERM)
        running.wait(30)


async def _at_least(client: JobsClient, n: int) -> bool:
    return await count(client) >= n


async def test_2000_committed_make_exactly_2000_jobs_with_the_relay_killed_twice(dsn, provisioned, service_env,
                                                                                  server, nc):
    committed = []
    with psycopg.connect(dsn) as conn:
        for tx in range(COMMITTED // PER_TX):
            with conn.transaction():
                committed += [seamq.jobs.enqueue(conn, "report.build", [tx, n], queue="reports")
                              for n in range(PER_TX)]
            try:
                with conn.transaction():  # and a rolled-back one after each
                    seamq.jobs.enqueue(conn, "report.build", [tx, -1], queue="reports")
                    raise RuntimeError
            except RuntimeError:
                pass
    env = dict(service_env, SEAMQ_RELAY__BATCH_SIZE="400")
    async with JobsClient(server) as client:
        for kill in range(2):
            # SHARE lock: the relay claims and publishes, but cannot mark rows published until we let go.
            blocker = psycopg.connect(dsn)
            blocker.execute("LOCK TABLE outbox_events IN SHARE MODE")
            running = relay(env)
            try:
                await wait_for(lambda: scalar(dsn, MARKING), timeout=120, what=f"a published batch before kill {kill + 1}")
                running.kill()  # kill -9 after publishing, before the marks commit
                running.wait()
                with psycopg.connect(dsn, autocommit=True) as admin:  # its connection is gone with it
                    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE query LIKE 'UPDATE outbox_events%%' AND pid <> pg_backend_pid()")
            finally:
                blocker.rollback()
                blocker.close()
                running.kill()
                running.wait()
            assert scalar(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL") == COMMITTED
            assert await count(client) >= 1  # published (and taken in) before the kill, yet unmarked
        final = relay(env)
        try:
            await wait_for(lambda: _at_least(client, COMMITTED), timeout=180, what="every committed job")
            await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL") == 0,
                           timeout=120, what="every row marked")
            await asyncio.sleep(1.0)  # anything that would come twice
            jobs = await client.jobs(limit=100_000)
        finally:
            final.send_signal(signal.SIGTERM)
            final.wait(30)
    ids = [j["id"] for j in jobs]
    assert len(ids) == len(set(ids)) == COMMITTED and set(ids) == set(committed)
    # Each kill left published rows unmarked, so the first batch went out three times: JetStream kept
    # one copy of each (Nats-Msg-Id = job id), and the job server created each job once.
    assert (await nc.jetstream().stream_info("OJS_ENQUEUE")).state.last_seq == COMMITTED
    assert all(uuid.UUID(i).version == 7 for i in ids)
