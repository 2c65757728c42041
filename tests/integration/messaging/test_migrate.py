import asyncio
import os
import subprocess

import psycopg
import pytest

from helpers import SEAMQ

from seamq.model import ErrorCode, SeamqError
from seamq.pg import migrate


def _tables(dsn):
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


async def test_upgrade_twice_applies_once(empty_dsn):
    first = await migrate.upgrade(empty_dsn)
    second = await migrate.upgrade(empty_dsn)
    assert [m.version for m in first] == [m.version for m in migrate.migrations()]
    assert second == []
    assert {"outbox_events", "inbox_messages", "seamq_migrations"} <= _tables(empty_dsn)


async def test_concurrent_upgrades_serialise(empty_dsn):
    results = await asyncio.gather(*(migrate.upgrade(empty_dsn) for _ in range(6)))
    applied = [m for result in results for m in result]
    assert len(applied) == len(migrate.migrations())  # exactly one process applied each
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM seamq_migrations").fetchone()[0] == len(migrate.migrations())


async def test_status_lists_pending_then_applied(empty_dsn):
    before = await migrate.status(empty_dsn)
    assert all(s.applied_at is None for s in before)
    await migrate.upgrade(empty_dsn)
    assert all(s.applied_at is not None for s in await migrate.status(empty_dsn))


async def test_edited_migration_is_refused(empty_dsn):
    await migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("UPDATE seamq_migrations SET checksum = 'tampered' WHERE version = 1")
    with pytest.raises(SeamqError) as err:
        await migrate.upgrade(empty_dsn)
    assert err.value.code == ErrorCode.MIGRATION_FAILED


def test_schema_has_sds047_columns_and_indexes(dsn):
    with psycopg.connect(dsn) as conn:
        cols = {
            (t, c) for t, c in conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema='public'"
            )
        }
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname='public'")}
    for column in ["id", "aggregate_type", "aggregate_id", "event_type", "event_version", "payload", "occurred_at",
                   "correlation_id", "causation_id", "published_at", "publish_attempts", "publish_error"]:
        assert ("outbox_events", column) in cols
    for column in ["message_id", "subject", "received_at", "processed_at", "attempts", "last_error",
                   "status", "dlq_metadata"]:
        assert ("inbox_messages", column) in cols
    assert {"idx_outbox_pending_seq", "idx_outbox_correlation", "idx_inbox_unprocessed"} <= indexes
    assert "idx_outbox_unpublished" not in indexes  # migration 0009: claims safe whatever the statistics say


def test_inbox_check_rejects_processed_before_received(dsn):
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO inbox_messages (message_id, subject, received_at, processed_at) "
            "VALUES (gen_random_uuid(), 's', now(), now() - interval '1 hour')"
        )


@pytest.mark.parametrize("worker", [["relay"], ["consume", "--consumer", "sea__from_vibespro"], ["replay"]])
def test_workers_refuse_a_database_without_the_schema(empty_dsn, nats_server, worker):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env.update(SEAMQ_DATABASE_URL=empty_dsn, SEAMQ_NATS__URL=nats_server.url,
               SEAMQ_CONSUMER__HANDLER_URL="http://127.0.0.1:9/handle")
    done = subprocess.run([*SEAMQ, *worker], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "SCHEMA_OUTDATED" in done.stderr and "seamq db upgrade" in done.stderr
