"""`seamq console` (and the console inside `seamq dev`): its pages over the parts seamq.doors opens
(the desk, the overview, the audit's findings, the users' sessions), the job server's admin API,
uvicorn."""

from __future__ import annotations

import asyncio

from seamq.console import pages_jobs, pages_messages
from seamq.console.app import Console, build, templates
from seamq.console.auth import Signer, Users
from seamq.doors import console_parts
from seamq.http.listen import config as uvicorn_config, listening_socket, server as uvicorn_server
from seamq.jobs.client import JobsClient
from seamq.observability import log
from seamq.settings import Settings
from seamq.topology import Topology


async def serve(settings: Settings, topology: Topology, *, host: str, port: int,
                stop: asyncio.Event | None = None, sock=None) -> None:
    """Serve until SIGTERM/SIGINT, or until `stop` is set when given."""
    secret = lambda s: s.get_secret_value() if s else None  # noqa: E731
    users = Users.parse(secret(settings.console.users))
    signer = Signer(secret(settings.console.session_secret), settings.console.session_hours)
    sock = sock or listening_socket(host, port)
    sampling = asyncio.Event()
    async with console_parts(settings, topology) as parts, \
            JobsClient(settings.jobs.url, token=settings.jobs.client_token(), timeout=10, retries=1) as jobs:
        desk, overview = parts.desk, parts.overview
        console = Console(users, signer, templates(), parts.sessions, desk.refused)
        app = build(console, [*pages_messages.routes(console, desk, overview, parts.audits),
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
