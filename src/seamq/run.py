"""Wiring: build workers from settings with the real adapters, and run them.

The CLI and `seamq dev` call these; workers themselves only see ports.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import asynccontextmanager
from typing import AsyncIterator

from psycopg_pool import AsyncConnectionPool

from seamq.nats.connect import connect
from seamq.nats.publisher import PipelinedPublisher
from seamq.observability import log
from seamq.pg.outbox_repo import PgOutbox
from seamq.relay import Relay, RelayConfig, listen_for_outbox
from seamq.settings import Settings
from seamq.topology import Topology, parse_duration


@asynccontextmanager
async def pg_pool(dsn: str, *, max_size: int = 4) -> AsyncIterator[AsyncConnectionPool]:
    pool = AsyncConnectionPool(
        dsn, min_size=1, max_size=max_size, open=False,
        check=AsyncConnectionPool.check_connection,  # drop connections a PG restart broke
        kwargs={"autocommit": False},
    )
    await pool.open(wait=False)
    try:
        yield pool
    finally:
        await pool.close()


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set `stop`: workers finish the batch in hand, then exit."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass


async def run_relay(settings: Settings, topology: Topology, stop: asyncio.Event) -> Relay:
    dsn = settings.database_dsn()
    nc = await connect(settings.nats, name="seamq-relay")
    publisher = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
    try:
        async with pg_pool(dsn) as pool:
            relay = Relay(
                PgOutbox(pool, max_backoff=settings.relay.max_backoff), publisher, topology,
                RelayConfig(
                    batch_size=settings.relay.batch_size, poll_interval=settings.relay.poll_interval,
                    max_backoff=settings.relay.max_backoff, max_payload=nc.max_payload,
                ),
                connected=lambda: nc.is_connected,
            )
            helpers = [asyncio.create_task(listen_for_outbox(dsn, relay.wake, stop))]
            if settings.relay.purge_older_than:
                window = parse_duration(settings.relay.purge_older_than)
                helpers.append(asyncio.create_task(purge_periodically(relay.outbox, window, stop)))
            log.info("relay_started", contexts=sorted(topology.contexts), batch_size=settings.relay.batch_size)
            try:
                await relay.run(stop)
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
            log.info("relay_stopped", published=relay.published_total)
            return relay
    finally:
        await publisher.close()
        await nc.drain()


async def purge_periodically(outbox: PgOutbox, older_than: float, stop: asyncio.Event, every: float = 600) -> None:
    """`relay.purge_older_than`: the relay purges published rows itself every 10 minutes."""
    while not stop.is_set():
        try:
            deleted = await outbox.purge(older_than)
            if deleted:
                log.info("outbox_purged", deleted=deleted, older_than_seconds=older_than)
        except Exception as exc:  # the next round will try again
            log.warning("outbox_purge_failed", error=str(exc))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass
