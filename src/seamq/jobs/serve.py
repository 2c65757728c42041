"""Wiring for `seamq jobs serve` (and the job server inside `seamq dev`): NATS from the usual
settings, the store, the engine, uvicorn."""

from __future__ import annotations

import asyncio
from pathlib import Path

from seamq.http.listen import config as uvicorn_config, listening_socket, server as uvicorn_server
from seamq.jobs.app import build_app
from seamq.jobs.auth import Tokens
from seamq.jobs.engine import Engine, collect_less
from seamq.jobs.hooks import Deliverer
from seamq.jobs.nats_hooks import NatsHooks
from seamq.jobs.nats_store import NatsJobStore
from seamq.jobs.poster import Poster
from seamq.nats.connect import connect
from seamq.observability import log
from seamq.settings import Settings


async def serve(settings: Settings, *, host: str, port: int, test_mode: bool = False,
                admin_ui: Path | None = None, stop: asyncio.Event | None = None, sock=None) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's own handlers), or until `stop` is set when given; then stop
    the engine and close NATS. `sock`: already listening (its owner said "ready" once it was)."""
    sock = sock or listening_socket(host, port)  # first: a taken port is said before anything starts
    nc = await connect(settings.nats, name="seamq-jobs")
    try:
        store = await NatsJobStore(nc, replicas=settings.jobs.replicas).start()
        # A worker over HTTP waits on each fetch and ack, and a fetch on a job coming due: their counts move
        # off its path (seamq.jobs.recounts).
        engine = await Engine(store, test_mode=test_mode, count_claims_later=True, count_acks_later=True).start()
        hooks, post = await NatsHooks(nc, replicas=store.replicas).start(), Poster(private_addresses=settings.jobs.webhook_private_addresses)
        delivering = asyncio.create_task(Deliverer(hooks, engine.store, engine.webhooks, post,
                                                   schedule=settings.jobs.webhook_retry_delays).run())
        try:
            tokens = Tokens.parse(*(t.get_secret_value() if t else None for t in (settings.jobs.tokens,
                                                                                   settings.jobs.read_tokens)))
            app = build_app(engine, test_mode=test_mode, admin_ui=admin_ui, tokens=tokens, post=post)
            config = uvicorn_config(app, host, port)
            if stop is None:  # the process is ours (seamq dev's embedded servers leave the host's collector alone)
                # What exists now (modules, the app) lives as long as the process: out of the collector's
                # sight, a full collection stops taking 30-50 ms (measured), which was the p99 of timer
                # lateness; and its youngest rounds as rare as the native worker's (docs/benchmarks.md 7y).
                collect_less()
            server = uvicorn_server(config, stop)
            log.info("jobs_serving", host=host, port=port, test_mode=test_mode, auth=tokens.required)
            await server.serve(sockets=[sock])
        finally:
            delivering.cancel()
            await asyncio.gather(delivering, return_exceptions=True)
            await post.close()
            await hooks.close()
            await engine.stop()
    finally:
        await nc.close()

