"""A worker's own HTTP endpoint: /metrics (Prometheus), /healthz (liveness) and
/readyz (readiness), answered from seamq.health.

aiohttp's server rather than Prometheus' thread server: the probes run in the
worker's event loop, so a loop that is blocked fails its liveness probe, as it
should, and readiness checks can use the worker's own async connections.
"""

from __future__ import annotations

import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from seamq.health import Answer, Health
from seamq.redact import redact


def _json(answer: Answer) -> web.Response:
    return web.Response(status=200 if answer.ok else 503, content_type="application/json",
                        text=redact(json.dumps(answer.body())))


def app(health: Health) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return _json(health.live())

    async def readyz(_: web.Request) -> web.Response:
        return _json(await health.ready())

    application = web.Application()
    application.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    return application


async def serve(health: Health, host: str, port: int) -> web.AppRunner:
    """Listening when it returns; `await runner.cleanup()` stops it."""
    runner = web.AppRunner(app(health), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
