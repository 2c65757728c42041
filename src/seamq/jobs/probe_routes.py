"""What load balancers and Prometheus ask of a job server (`ext-observability`): `/health` and `/ready`
at the root beside `/ojs/v1/health`, and `/metrics` in Prometheus' text format.

`/metrics` gives every queue's jobs by state (`seamq_jobs`, the exact counts every server shows, so
any server may be scraped), what this server processed, failed and enqueued (`seamq_jobs_*_total`,
this process only: a server's own throughput), and the process' own metrics.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import model
from seamq.jobs.api import VERSION, answer
from seamq.jobs.engine import Engine

TEXT = "text/plain; version=0.0.4; charset=utf-8"


class _Taken:
    """A collector of values read before the scrape (the counts are read from NATS, asynchronously)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def probes(engine: Engine) -> list[Route]:
    def up() -> bool:
        return engine.store.reachable()

    async def health(request: Request) -> Response:
        """200 while NATS answers; 503 while it is away, so a load balancer sends requests elsewhere
        (the process is not broken: NATS' client connects again by itself)."""
        ok = up()
        return answer({"status": "ok" if ok else "degraded", "version": VERSION,
                       "backend": {"type": "nats", "status": "ok" if ok else "unhealthy"}}, 200 if ok else 503)

    async def ready(request: Request) -> Response:
        ok = up()
        return answer({"status": "ready" if ok else "not_ready"}, 200 if ok else 503)

    async def metrics(request: Request) -> Response:
        jobs = GaugeMetricFamily("seamq_jobs", "Jobs by queue and state, as every server counts them",
                                 labels=["queue", "state"])
        for name in await engine.queues.names():
            stats = await engine.queues.stats(name)
            for state in model.STATES:
                jobs.add_metric([name, state.value], stats[state])
        mine = []
        for kind in ("processed", "failed", "enqueued"):
            family = CounterMetricFamily(f"seamq_jobs_{kind}", f"Jobs {kind} through this server", labels=["queue"])
            for queue, count in engine.events.meter.totals(kind).items():
                family.add_metric([queue], count)
            mine.append(family)
        registry = CollectorRegistry()
        registry.register(_Taken([jobs, *mine]))
        return Response(generate_latest(registry) + generate_latest(REGISTRY), media_type=TEXT)

    return [Route("/ojs/v1/health", health, methods=["GET"]), Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
