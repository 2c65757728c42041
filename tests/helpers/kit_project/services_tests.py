"""A user's test against real services from seamq.testing's fixtures (tests/integration/messaging/test_testing_kit.py runs it)."""

import psycopg
from nats.aio.client import Client

from seamq import outbox
from shop import VibeCreatedV1


def test_the_outbox_in_a_migrated_database(seamq_database):
    with psycopg.connect(seamq_database) as conn:
        outbox.add(conn, VibeCreatedV1(vibe_id="v-1"))
        assert conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0] == 1


def test_each_test_has_a_database_of_its_own(seamq_database):
    with psycopg.connect(seamq_database) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0] == 0


async def test_the_topology_is_provisioned(seamq_nats, seamq_topology):
    nc = Client()
    await nc.connect(seamq_nats.url)
    try:
        info = await nc.jetstream().stream_info("VIBESPRO_EVENTS")
        assert info.config.subjects == ["vibespro.event.>"]
    finally:
        await nc.close()
