"""Wiring: build workers from settings with the real adapters, and run them.

The CLI and `seamq dev` call these; workers themselves only see ports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
from psycopg_pool import AsyncConnectionPool

from seamq.consumer import InboxConsumer
from seamq.health import Health
from seamq.inprocess import InProcessHandler, SchemaChecked
from seamq.http.client import HttpHandler, Refusals, http_client
from seamq.model import ErrorCode, SeamqError
from seamq.nats.connect import connect
from seamq.nats.fast_batch import FastBatchPublisher, batched_streams
from seamq.nats.publisher import PipelinedPublisher
from seamq.nats.rehome import Rehoming
from seamq.nats.messages import JsMessageStore
from seamq.nats.pull import Deliveries
from seamq.nats import readiness
from seamq.nats.partitions import PartitionedDeliveries
from seamq.observability import log
from seamq.pg import migrate, partitions
from seamq.pg.dlq_repo import PgDeadLetters
from seamq.memory import NoInbox
from seamq.pg.inbox_repo import PgInbox, consumer_session
from seamq.pg.notify import PgWakeup
from seamq.pg.readiness import PgPing
from seamq.pg.outbox_repo import PgOutbox, relay_session
from seamq.registry import Registry, import_object, load_registry
from seamq.relay import Relay
from seamq.dlq_replay import Replayer
from seamq.settings import Settings
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology, inbox_retention as checked_retention
from seamq.units import parse_duration


ONE_SHOT_TIMEOUT = 5.0  # a command run by a person or a script says "unavailable" within seconds


@asynccontextmanager
async def pg_pool(dsn: str, *, max_size: int = 4, configure=None, timeout: float = 30.0,
                  one_shot: bool = False) -> AsyncIterator[AsyncConnectionPool]:
    """`timeout`: how long a checkout waits for a connection. `one_shot`: a command that ends, not a
    worker: it waits ONE_SHOT_TIMEOUT, and the pool's own warnings about each failed connection stay
    quiet (the command says once, with a code, that the database is away)."""
    if one_shot:
        timeout = ONE_SHOT_TIMEOUT
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        await _refused_at_once(dsn)
    # No health check per checkout (a round trip per transaction): a connection a
    # PostgreSQL restart broke fails its transaction, which the workers retry,
    # and the pool discards it on return.
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=max_size, open=False, configure=configure,
                               kwargs={"autocommit": False}, timeout=timeout)
    await pool.open(wait=False)
    try:
        yield pool
    finally:
        await pool.close()


# A server that answers but will not have us does not change its mind within a command's wait; one
# that is starting, stopping or full may.
_PASSING = ("starting up", "shutting down", "in recovery", "too many clients", "remaining connection slots")


async def _refused_at_once(dsn: str) -> None:
    """A database that answers and refuses (no such database, role or password) is said at once with
    PostgreSQL's reason; the pool alone said only that no connection came within 5 s."""
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(ONE_SHOT_TIMEOUT)))
    except psycopg.OperationalError as exc:
        text = str(exc)
        if "FATAL:" in text and not any(passing in text for passing in _PASSING):
            raise SeamqError(ErrorCode.DATABASE_UNAVAILABLE, f"PostgreSQL refused the connection: "
                             f"{text.split('FATAL:', 1)[1].strip()} (check SEAMQ_DATABASE_URL)") from None
        if "Connection refused" in text:  # nothing listens there: said at once, as a connection of its own said it
            raise SeamqError(ErrorCode.DATABASE_UNAVAILABLE, f"{text.strip()} (check SEAMQ_DATABASE_URL)") from None
        return  # busy or starting: the pool waits for it, as before
    await conn.close()


def stop_on_signals(stop: asyncio.Event) -> list[int]:
    """SIGTERM/SIGINT set `stop`: workers finish the batch in hand, then exit. Returns the list the
    signals received are put in, so the command can exit as the signal asks (130 after SIGINT)."""
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def stopping(sig: int) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping, sig)
        except (NotImplementedError, RuntimeError):
            pass
    return received


def _readiness(health: Health, stop: asyncio.Event, nc, dsn: str | None, streams: list[str],
               consumers: list[tuple[str, str]] = ()) -> PgPing | None:
    """A worker's readiness checks: NATS, PostgreSQL (when it uses it; the PgPing to close), provisioned objects."""
    health.stop = stop
    health.check("nats", readiness.connected(nc))
    health.check("provisioned", readiness.provisioned(nc, streams, consumers))
    ping = PgPing(dsn) if dsn else None
    if ping:
        health.check("postgres", ping)
    return ping


async def run_relay(settings: Settings, topology: Topology, stop: asyncio.Event, health: Health | None = None) -> Relay:
    dsn = settings.database_dsn()
    await migrate.require_current(dsn)
    nc = await connect(settings.nats, name="seamq-relay")
    streams = sorted({c.stream.name for c in topology.contexts.values()})
    health = health or Health(settings.health_stale_after)
    ping = _readiness(health, stop, nc, dsn, streams)
    pipelined = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
    batched = await batched_streams(nc, streams)
    publisher = Rehoming(await FastBatchPublisher(nc, batched, pipelined, timeout=settings.relay.publish_timeout)
                         .start(), nc)
    try:
        async with pg_pool(dsn, max_size=settings.relay.loops + 2, configure=relay_session) as pool:
            wakeup = PgWakeup(dsn)
            relay = Relay(
                PgOutbox(pool), publisher, wakeup, topology,
                settings.relay, max_payload=nc.max_payload, connected=lambda: nc.is_connected, health=health,
            )
            retention = settings.relay.purge_older_than
            helpers = [asyncio.create_task(wakeup.listen(stop)), asyncio.create_task(maintain_periodically(
                dsn, stop, outbox=parse_duration(retention) if retention else None))]
            log.info("relay_started", contexts=sorted(topology.contexts), batch_size=settings.relay.batch_size,
                     fast_batch=sorted(batched), pipelined=[s for s in streams if s not in batched])
            try:
                await relay.run(stop)
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                await wakeup.close()
            log.info("relay_stopped", published=relay.published_total)
            return relay
    finally:
        await ping.close()
        await publisher.close()
        await pipelined.close()
        await _close(nc)


async def maintain_periodically(dsn: str, stop: asyncio.Event, *, outbox: float | None = None,
                                inbox: float | None = None, every: float = 600) -> None:
    """Every worker keeps the tables' dated partitions made ahead, at start and every 10 minutes,
    and applies its retention (`relay.purge_older_than`, `consumer.purge_older_than`): no cron."""
    outbox_window = timedelta(seconds=outbox) if outbox else None
    inbox_window = timedelta(seconds=inbox) if inbox else None
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                for purged in await partitions.maintain(conn, outbox=outbox_window, inbox=inbox_window):
                    if purged.dropped or purged.deleted:
                        log.info("purged", table=purged.table, partitions=len(purged.dropped), deleted=purged.deleted)
        except Exception as exc:  # the next round will try again
            log.warning("partition_maintenance_failed", error=str(exc))
        await sleep_unless_stopped(stop, every)


async def run_consumer(
    settings: Settings, topology: Topology, name: str, stop: asyncio.Event, registry: Registry | None = None,
    health: Health | None = None,
) -> InboxConsumer:
    """Run one durable consumer of the topology until `stop`."""
    spec = topology.consumer(name)
    cfg = settings.consumer
    registry = registry or (load_registry(cfg.registry) if cfg.registry else Registry(default=cfg.handler_url))
    if not registry.routes and not registry.default:
        raise SeamqError(ErrorCode.INVALID_CONFIG,
                         "no handlers: set consumer.registry or consumer.handler_url (SEAMQ_CONSUMER__HANDLER_URL)")
    if cfg.inbox:
        await migrate.require_current(settings.database_dsn())
    retention = inbox_retention(settings, topology) if cfg.inbox else None
    secret = cfg.handler_secret.get_secret_value() if cfg.handler_secret else None
    nc = await connect(settings.nats, name=f"seamq-consumer-{name}")
    dlq_stream = topology.dlq_stream(spec.name)
    health = health or Health(settings.health_stale_after)
    ping = _readiness(health, stop, nc, settings.database_dsn() if cfg.inbox else None,
                      [spec.stream, dlq_stream], [(spec.stream, d) for d in spec.durables()])
    client = http_client(max_connections=cfg.concurrency * 2)
    try:
        refusals = Refusals()
        health.check("handler_signature", refusals.check)
        handlers = build_handlers(registry, http_client=client, secret=secret, timeout=cfg.handler_timeout,
                                  source=spec.source, target=spec.target, refusals=refusals, consumer=spec.name)
        dlq = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
        batch = spec.fetch_batch(cfg.batch_size)
        buffer = spec.fetch_batch(2 * batch)
        if spec.partitions:  # one process at a time per partition: order across processes
            source = await PartitionedDeliveries(nc, spec, buffer=buffer, gaps=cfg.ordered).start()
        else:
            source = await Deliveries.open(nc, spec.stream, spec.name, buffer=buffer, ordered=cfg.ordered,
                                           alone=cfg.alone)
        async with _maybe_pool(settings, cfg) as pool:
            inbox = PgInbox(spec.name, pool) if pool is not None else NoInbox()
            largest = _largest_dead_letter(nc.max_payload, topology.contexts[spec.target].dlq.max_msg_size)
            consumer = InboxConsumer(spec, source, inbox, dlq, handlers, cfg, max_payload=largest, health=health)
            log.info("consumer_started", consumer=name, stream=spec.stream, concurrency=cfg.concurrency,
                     partitions=spec.partitions)
            upkeep = asyncio.create_task(maintain_periodically(settings.database_dsn(), stop, inbox=retention)) \
                if cfg.inbox else None
            try:
                await consumer.run(stop)
            finally:
                if upkeep:
                    upkeep.cancel()
                await source.close()
            log.info("consumer_stopped", consumer=name)
            return consumer
    finally:
        if ping:
            await ping.close()
        await client.close()
        await _close(nc)


def inbox_retention(settings: Settings, topology: Topology) -> float | None:
    """`consumer.purge_older_than` in seconds, checked (seamq.topology.inbox_retention)."""
    if not (value := settings.consumer.purge_older_than):
        return None
    return checked_retention(topology, parse_duration(value), f"consumer.purge_older_than {value}",
                             nak_max=settings.consumer.nak_max, replay_window=settings.replay.window)


def _largest_dead_letter(max_payload: int, dlq_max_msg_size: int) -> int:
    return min(max_payload, dlq_max_msg_size) if dlq_max_msg_size > 0 else max_payload


async def _close(nc) -> None:
    """Flush what we published, then close. (drain() can hang on a pull subscription.)"""
    try:
        await nc.flush(timeout=2)
    except Exception:
        pass
    await nc.close()


@asynccontextmanager
async def replay_tools(settings: Settings, topology: Topology, *, persistent: bool = True,
                       health: Health | None = None, stop: asyncio.Event | None = None, pool_size: int = 2):
    """A Replayer with its connections: for the worker (with `health` and `stop`) and for `seamq dlq replay`."""
    await migrate.require_current(settings.database_dsn())
    nc = await connect(settings.nats, name="seamq-replay", persistent=persistent)
    publisher = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
    ping = _readiness(health, stop, nc, settings.database_dsn(), sorted(
        s.name for c in topology.contexts.values() for s in (c.stream, c.dlq))) if health else None
    try:
        async with pg_pool(settings.database_dsn(), max_size=pool_size,
                           one_shot=not persistent) as pool:
            yield Replayer(PgDeadLetters(pool), JsMessageStore(nc.jetstream()), publisher, topology,
                           settings.replay.policy(), nak_max=settings.consumer.nak_max,
                           interval=settings.replay.interval, health=health)
    finally:
        if ping:
            await ping.close()
        await publisher.close()
        await _close(nc)


@asynccontextmanager
async def dlq_desk(settings: Settings, topology: Topology, *, persistent: bool = False, pool_size: int = 2):
    """What people do with dead letters (seamq.dlq_desk), on its own connections: `seamq dlq`, the console."""
    from seamq.dlq_desk import DeadLetterDesk

    async with replay_tools(settings, topology, persistent=persistent, pool_size=pool_size) as replayer:
        yield DeadLetterDesk(replayer)


async def run_replay(settings: Settings, topology: Topology, stop: asyncio.Event,
                     health: Health | None = None) -> Replayer:
    async with replay_tools(settings, topology, health=health or Health(settings.health_stale_after),
                            stop=stop) as replayer:
        log.info("replay_started", reasons=settings.replay.reasons, max_attempts=settings.replay.max_attempts)
        await replayer.run(stop)
        return replayer


@asynccontextmanager
async def auditor(settings: Settings, topology: Topology, *, health: Health | None = None,
                  stop: asyncio.Event | None = None, persistent: bool = True) -> AsyncIterator:
    """The audit (seamq.audit) with its connections: for the worker and for `seamq audit --once`."""
    from seamq.audit import Auditor
    from seamq.nats.stream_index import JsStreamIndex
    from seamq.pg.audit_repo import PgAuditStore

    await migrate.require_current(settings.database_dsn())
    nc = await connect(settings.nats, name="seamq-audit", persistent=persistent)
    publisher = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
    streams = sorted(c.stream.name for c in topology.contexts.values())
    ping = _readiness(health, stop, nc, settings.database_dsn(), streams) if health else None
    cfg = settings.audit
    try:
        async with pg_pool(settings.database_dsn(), max_size=2, one_shot=not persistent) as pool:
            yield Auditor(PgAuditStore(pool), JsStreamIndex(nc), publisher, topology, lookback=cfg.lookback,
                          settle=cfg.settle, span=settings.relay.batch_size, page=cfg.page, interval=cfg.interval,
                          repair=cfg.repair, health=health)
    finally:
        if ping:
            await ping.close()
        await publisher.close()
        await _close(nc)


async def run_audit(settings: Settings, topology: Topology, stop: asyncio.Event, health: Health | None = None) -> None:
    async with auditor(settings, topology, health=health or Health(settings.health_stale_after), stop=stop) as audit:
        log.info("audit_started", contexts=sorted(topology.contexts), consumers=sorted(topology.consumers),
                 lookback=settings.audit.lookback, repair=settings.audit.repair)
        await audit.run(stop)


@asynccontextmanager
async def _maybe_pool(settings: Settings, cfg) -> AsyncIterator[AsyncConnectionPool | None]:
    if not cfg.inbox:
        log.warning("consumer_inbox_off", detail="at-least-once: duplicates reach handlers")
        yield None
        return
    async with pg_pool(settings.database_dsn(), max_size=cfg.concurrency + 1, configure=consumer_session) as pool:
        yield pool


def build_handlers(registry: Registry, *, http_client=None, secret: str | None = None, timeout: float = 10.0,
                   source: str | None = None, target: str | None = None, refusals: Refusals | None = None,
                   consumer: str | None = None):
    """Resolve every route of `registry` for one consumer, `target` consuming from `source`, now: a bad
    import path fails at start, not on the first message. Returns (event_type, version) -> handler.
    A registry may hold several contexts' manifests: only the target's routes are taken, and with no
    target, two contexts' routes for one event are refused rather than one picked."""

    def make(target, route_timeout: float | None):
        seconds = route_timeout or timeout
        if callable(target):
            return InProcessHandler(target, timeout_seconds=seconds)
        if target.startswith(("http://", "https://")):
            return HttpHandler(target, client=http_client, secret=secret, timeout=seconds, refusals=refusals,
                               consumer=consumer)
        return InProcessHandler(import_object(target), timeout_seconds=seconds)

    table, owner = {}, {}
    for route in registry.routes:
        if route.source not in (None, source) or target is not None and route.context not in (None, target):
            continue
        key = (route.event_type, route.version)
        if key in owner and owner[key] != route.context:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"the registry has handlers of {owner[key]} and {route.context} "
                             f"for {route.source or '*'}.event.{route.event_type}.v{route.version}: name the "
                             "consuming context")
        owner[key] = route.context
        handler = make(route.handler, route.timeout)
        model = getattr(handler, "model", None)
        if model and (model.seamq_subject.name, model.seamq_subject.version, model.seamq_subject.context) != (
                route.event_type, route.version, route.source or model.seamq_subject.context):
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{handler!r} takes {model.seamq_subject}, but its route is "
                             f"{route.source or '*'}.event.{route.event_type}.v{route.version}")
        table[(route.event_type, route.version)] = SchemaChecked(handler, route.schema) if route.schema else handler
    fallback = make(registry.default, None) if registry.default else None
    return lambda event_type, version: table.get((event_type, version), fallback)
