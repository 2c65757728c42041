"""The one door through which the faces (the CLI, the console) reach PostgreSQL and NATS for people's
work. Each door opens what its work needs, hands over a desk or a reader that speaks in seamq's own
values, and closes what it opened: a face names what it wants done; which driver does it is decided
here, so that no face opens a connection or writes a query of its own (tests/unit/product/test_house.py).

Drivers load with the door that needs them: `seamq --help` and a command refused for its options
start no driver at all.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from seamq.model import ErrorCode, SeamqError, describe
from seamq.observability import log
from seamq.settings import Settings
from seamq.topology import Topology

if TYPE_CHECKING:
    from seamq.console.overview import Overview
    from seamq.dlq_desk import DeadLetterDesk, DeadLetterReader
    from seamq.dlq_replay import Replayer
    from seamq.tables_desk import TablesDesk


@asynccontextmanager
async def tables_desk(settings: Settings) -> AsyncIterator["TablesDesk"]:
    """The outbox's and the inbox's tables for people (seamq.tables_desk), on a connection of their own."""
    from seamq.pg.inbox_repo import PgInboxTables
    from seamq.pg.outbox_repo import PgOutbox
    from seamq.tables_desk import TablesDesk
    from seamq.wiring import pg_pool

    async with pg_pool(settings.database_dsn(), max_size=1, one_shot=True) as pool:
        yield TablesDesk(PgOutbox(pool), PgInboxTables(pool))


@asynccontextmanager
async def dead_letter_reader(settings: Settings) -> AsyncIterator["DeadLetterReader"]:
    """Dead letters and inbox records to read, on the database alone (no NATS): `seamq dlq list`, `inbox show`."""
    from seamq.dlq_desk import DeadLetterReader
    from seamq.pg.dlq_repo import PgDeadLetters
    from seamq.wiring import pg_pool

    async with pg_pool(settings.database_dsn(), max_size=1, one_shot=True) as pool:
        yield DeadLetterReader(PgDeadLetters(pool))


class OverviewReader:
    """What the console's overview reads where it lives: PostgreSQL's tables (seamq.pg.overview) at
    once, and JetStream's numbers (seamq.nats.readiness, seamq.nats.members) once `attach`ed to NATS."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.nc = pool, None

    def attach(self, nc: Any) -> None:
        self.nc = nc

    @property
    def nats_up(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def tables(self) -> Any:
        from seamq.pg import overview

        return await overview.read(self.pool)

    async def durable(self, stream: str, durable: str, *, timeout: float) -> dict[str, Any]:
        from seamq.nats.readiness import durable_numbers

        return await durable_numbers(self.nc, stream, durable, timeout=timeout)

    async def members(self, consumer: str) -> list[dict[str, Any]]:
        from seamq.nats.members import members

        return await members(self.nc, consumer)


async def upgrade(settings: Settings, progress: Callable[[str], None]) -> list:
    """The migrations this call applied (seamq.pg.migrate.Migration)."""
    from seamq.pg import migrate

    return await migrate.upgrade(settings.database_dsn(), progress=progress)


async def migrations(settings: Settings) -> list:
    """Every migration shipped, with when it was applied (seamq.pg.migrate.MigrationStatus)."""
    from seamq.pg import migrate

    return await migrate.status(settings.database_dsn())


async def provision(settings: Settings, topology: Topology, *, dry_run: bool = False, force: bool = False,
                    migrate: bool = False) -> list:
    """The topology's streams and consumers on the server: the changes made, or those `dry_run` would
    make (seamq.nats.provision.Change)."""
    from seamq.nats.connect import connect
    from seamq.nats.provision import apply, plan

    nc = await connect(settings.nats, name="seamq-provision", persistent=False)
    try:
        js = nc.jetstream()
        return await (plan(js, topology) if dry_run else apply(js, topology, force=force, migrate=migrate))
    finally:
        await nc.close()


async def reachable(settings: Settings, *, database: bool = False, nats: bool = False,
                    stream: str | None = None) -> None:
    """What a job needs answers now: the database, NATS, a stream; else a coded error, in seconds."""
    if database:
        from seamq.pg.alone import alone, answers

        await alone(settings.database_dsn(), answers, timeout=5)
    if nats or stream:
        from seamq.nats.connect import connect
        from seamq.nats.readiness import has_stream

        nc = await connect(settings.nats, name="seamq-check", persistent=False)
        try:
            if stream and not await has_stream(nc, stream):
                raise SeamqError(ErrorCode.NOT_FOUND, f"no stream {stream!r} on {settings.nats.url}")
        finally:
            await nc.close()


JOIN_EVERY = 5.0  # seconds between attempts to join NATS while it is away


class _NatsAway:
    """The desk's message store and publisher until the console has joined NATS."""

    async def get(self, stream: str, seq: int):
        raise _away()

    async def delete(self, stream: str, seq: int) -> bool:
        raise _away()

    async def publish_many(self, messages: list):
        raise _away()


def _away() -> SeamqError:
    return SeamqError(ErrorCode.BROKER_UNAVAILABLE, "NATS (SEAMQ_NATS__URL) is away: the console shows what "
                                                    "PostgreSQL holds, and acts once NATS is back")


@dataclass(frozen=True)
class ConsoleParts:
    desk: "DeadLetterDesk"
    overview: "Overview"
    audits: Any  # seamq.ports.AuditStore
    sessions: Any  # seamq.console.app's SessionStore


@asynccontextmanager
async def console_parts(settings: Settings, topology: Topology) -> AsyncIterator[ConsoleParts]:
    """The console's desk (seamq.dlq_desk), overview, audit findings and users' sessions, on one pool.

    The console is the on-call tool, so it starts without NATS: what PostgreSQL holds shows at once,
    JetStream's numbers show as unknown, and an action that needs NATS is refused with
    BROKER_UNAVAILABLE, until a task in the background has joined NATS and put its parts in."""
    from seamq.console.overview import Overview
    from seamq.dlq_desk import DeadLetterDesk
    from seamq.dlq_replay import Replayer
    from seamq.pg import migrate
    from seamq.pg.audit_repo import PgAuditStore
    from seamq.pg.console_sessions import PgSessions
    from seamq.pg.dlq_repo import PgDeadLetters
    from seamq.wiring import pg_pool

    dsn = settings.database_dsn()
    await migrate.require_current(dsn)
    async with pg_pool(dsn, max_size=6) as pool:
        away = _NatsAway()
        replayer = Replayer(PgDeadLetters(pool), away, away, topology, settings.replay.policy(),
                            nak_max=settings.consumer.nak_max, interval=settings.replay.interval)
        overview = Overview(OverviewReader(pool), topology)
        opened: list = []
        joining = asyncio.create_task(_join_nats(settings, replayer, overview, opened))
        try:
            yield ConsoleParts(DeadLetterDesk(replayer), overview, PgAuditStore(pool), PgSessions(pool))
        finally:
            joining.cancel()
            with suppress(asyncio.CancelledError):
                await joining
            for close in reversed(opened):
                with suppress(Exception):
                    await close()


async def _join_nats(settings: Settings, replayer: "Replayer", overview: "Overview", opened: list) -> None:
    """Connect (once connected, the client rides out later outages itself), then put the parts in."""
    from seamq.nats.connect import connect
    from seamq.nats.messages import JsMessageStore
    from seamq.nats.publisher import PipelinedPublisher

    attempt = 0
    while True:
        attempt += 1
        try:
            nc = await connect(settings.nats, name="seamq-console", persistent=True)
            break
        except Exception as exc:
            if attempt == 1:
                log.warning("console_without_nats", error=describe(exc), detail="the pages show what PostgreSQL "
                            f"holds; joining NATS again every {JOIN_EVERY:g} s")
            await asyncio.sleep(JOIN_EVERY)
    opened.append(nc.close)
    publisher = await PipelinedPublisher(nc, timeout=settings.relay.publish_timeout).start()
    opened.append(publisher.close)
    replayer.messages, replayer.publisher = JsMessageStore(nc.jetstream()), publisher
    overview.reader.attach(nc)
    log.info("console_joined_nats", attempts=attempt)


def coded(exc: BaseException) -> SeamqError | None:
    """A failure a person can act on (a service away, a refusal), as a SeamqError; None for a bug."""
    from seamq.nats import connect
    from seamq.pg import errors

    if isinstance(exc, SeamqError):
        return exc
    return errors.coded(exc) or connect.coded(exc)


def away(exc: BaseException, *, job_server: bool = False) -> str | None:
    """Which of the services the console reads `exc` says is away, with the setting that points at
    it; None when it is no service's absence. `job_server`: the failure was the job server's
    client's, so a socket's error is that server's, not NATS's."""
    from seamq.nats.connect import broker_away
    from seamq.pg.errors import database_away

    if database_away(exc):
        return "PostgreSQL (SEAMQ_DATABASE_URL)"
    if job_server:
        return "the job server (SEAMQ_JOBS__URL)"
    if broker_away(exc):
        return "NATS (SEAMQ_NATS__URL)"
    return None
