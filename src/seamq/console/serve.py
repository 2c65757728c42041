"""Wiring for `seamq console` (and the console inside `seamq dev`): the desk and the overview on the
usual settings' PostgreSQL and NATS, the job server's admin API, uvicorn.

The console is the on-call tool, so it starts without NATS: what PostgreSQL holds shows at once,
JetStream's numbers show as unknown, and an action that needs NATS is refused with
BROKER_UNAVAILABLE, until a task in the background has joined NATS and put its parts in.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager, suppress

from seamq.console import pages_jobs, pages_messages
from seamq.console.app import Console, build, templates
from seamq.console.auth import Signer, Users
from seamq.http.listen import config as uvicorn_config, listening_socket, server as uvicorn_server
from seamq.jobs.client import JobsClient
from seamq.observability import log
from seamq.pg.console_sessions import PgSessions
from seamq.settings import Settings
from seamq.topology import Topology
from seamq.console.overview import Overview
from seamq.dlq_desk import DeadLetterDesk
from seamq.dlq_replay import Replayer
from seamq.model import ErrorCode, SeamqError, describe
from seamq.nats.connect import connect
from seamq.nats.messages import JsMessageStore
from seamq.nats.publisher import PipelinedPublisher
from seamq.pg import migrate
from seamq.pg.dlq_repo import PgDeadLetters
from seamq.wiring import pg_pool

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


@asynccontextmanager
async def console_parts(settings: Settings, topology: Topology):
    """The console's desk (seamq.dlq_desk) and its overview, on one pool, joined to NATS when it can be."""
    dsn = settings.database_dsn()
    await migrate.require_current(dsn)
    async with pg_pool(dsn, max_size=6) as pool:
        away = _NatsAway()
        replayer = Replayer(PgDeadLetters(pool), away, away, topology, settings.replay.policy(),
                            nak_max=settings.consumer.nak_max, interval=settings.replay.interval)
        overview = Overview(pool, None, topology)
        opened: list = []
        joining = asyncio.create_task(_join_nats(settings, replayer, overview, opened))
        try:
            yield DeadLetterDesk(replayer), overview
        finally:
            joining.cancel()
            with suppress(asyncio.CancelledError):
                await joining
            for close in reversed(opened):
                with suppress(Exception):
                    await close()


async def _join_nats(settings: Settings, replayer: Replayer, overview: Overview, opened: list) -> None:
    """Connect (once connected, the client rides out later outages itself), then put the parts in."""
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
    overview.attach(nc)
    log.info("console_joined_nats", attempts=attempt)


async def serve(settings: Settings, topology: Topology, *, host: str, port: int,
                stop: asyncio.Event | None = None, sock=None) -> None:
    """Serve until SIGTERM/SIGINT, or until `stop` is set when given."""
    secret = lambda s: s.get_secret_value() if s else None  # noqa: E731
    users = Users.parse(secret(settings.console.users))
    signer = Signer(secret(settings.console.session_secret), settings.console.session_hours)
    sock = sock or listening_socket(host, port)
    sampling = asyncio.Event()
    async with console_parts(settings, topology) as (desk, overview), \
            JobsClient(settings.jobs.url, token=settings.jobs.client_token(), timeout=10, retries=1) as jobs:
        console = Console(users, signer, templates(), PgSessions(desk.store.pool), desk.refused)
        app = build(console, [*pages_messages.routes(console, desk, overview),
                              *pages_jobs.routes(console, desk, jobs)])
        config = uvicorn_config(app, host, port)
        server = uvicorn_server(config, stop)
        sampler = asyncio.create_task(overview.sample(sampling))
        log.info("console_serving", host=host, port=port, users=len(users.passwords))
        try:
            await server.serve(sockets=[sock])
        finally:
            sampling.set()
            await sampler
