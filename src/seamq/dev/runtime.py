"""`seamq dev` (`make run`): the whole platform on one machine, no setup by hand.

Starts nats-server and PostgreSQL (unless SEAMQ_NATS__URL / SEAMQ_DATABASE_URL
point elsewhere), applies migrations, provisions the topology, prints what
runs where, says "ready", and runs the workers until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import secrets
from contextlib import ExitStack
from pathlib import Path

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from seamq.embedded import NatsCluster, NatsServer, PostgresServer, free_port, port_is_free
from seamq.nats.connect import connect
from seamq.nats.fast_batch import batched_streams
from seamq.nats.provision import apply
from seamq.model import ErrorCode, SeamqError
from seamq.pg import migrate
from seamq.dev.demo import HandlerServices, dashboard, render, stats, workload
from seamq.observability import configure_logging
from seamq.wiring import run_consumer, run_relay, run_replay, stop_on_signals
from seamq.settings import NatsSettings, Settings, redact_url
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def _service_port(given: int | None, default: int, what: str) -> int:
    """A port asked for is that port or an error; with none asked for, the usual one when free."""
    if given is None:
        return _port(default)
    if not port_is_free(given):
        raise SeamqError(ErrorCode.PORT_IN_USE, f"127.0.0.1:{given} ({what}) is in use by another process: stop it, "
                                                "or pick another port")
    return given


def start_embedded(settings: Settings, data_dir: Path, stack: ExitStack, *, cluster: int = 1,
                   started: list | None = None) -> Settings:
    """Start what is not configured externally (NATS as one server or a cluster of `cluster`);
    returns settings pointing at it. Each process started is added to `started`."""
    started = [] if started is None else started
    update = {}
    if "nats" not in settings.model_fields_set:
        first = _service_port(settings.embedded.nats_port, 4222, "--nats-port, SEAMQ_EMBEDDED__NATS_PORT")
        sync = settings.embedded.nats_sync
        nats = (NatsCluster(data_dir / "nats-cluster", cluster, ports=[first] + [free_port() for _ in range(cluster - 1)],
                            sync=sync)
                if cluster > 1 else NatsServer(data_dir / "nats", first, sync=sync))
        nats.start()
        stack.callback(nats.stop)
        started.extend(nats.nodes if cluster > 1 else [nats])
        update["nats"] = NatsSettings(url=nats.url)
    if settings.database_url is None:
        pg = PostgresServer(data_dir / "pg", _service_port(settings.embedded.pg_port, 5432, "--pg-port, SEAMQ_EMBEDDED__PG_PORT"))
        pg.start()
        stack.callback(pg.stop)
        started.append(pg)
        update["database_url"] = SecretStr(pg.create_database("seamq"))
    return settings.model_copy(update=update)


async def provision(settings: Settings, topology: Topology):
    """The changes made, and the streams the relay will publish to in fast batches."""
    nc = await connect(settings.nats, name="seamq-dev", persistent=False)
    try:
        changes = await apply(nc.jetstream(), topology)
        return changes, await batched_streams(nc, [s.name for s in topology.streams()])
    finally:
        await nc.close()


def describe(console: Console, settings: Settings, topology: Topology, changes, batched: set[str]) -> None:
    table = Table("service", "where", title="seamq dev")
    servers = settings.nats.url.split(",")
    table.add_row("nats-server (JetStream)" if len(servers) == 1 else f"NATS cluster ({len(servers)} servers)",
                  "\n".join(servers))
    table.add_row("PostgreSQL", redact_url(settings.database_dsn()))
    table.add_row("JetStream fsync", settings.embedded.nats_sync)
    console.print(table)
    actions = {(c.kind, c.name): c.action for c in changes}
    streams = Table("stream", "subjects", "storage", "max age", "replicas", "relay publishes", "provisioned")
    events = {c.stream.name for c in topology.contexts.values()}
    for s in topology.streams():
        mode = ("fast batch" if s.name in batched else "pipelined") if s.name in events else "-"
        streams.add_row(s.name, ", ".join(s.subjects), s.storage, f"{s.max_age / 86400:g}d", str(s.replicas),
                        mode, actions.get(("stream", s.name), "?"))
    console.print(streams)
    consumers = Table("consumer", "stream", "filter", "partitions", "ack wait", "max deliver", "max ack pending",
                      "provisioned")
    for c in topology.consumers.values():
        consumers.add_row(c.name, c.stream, c.filter_subject, str(c.partitions or "-"), f"{c.ack_wait:g}s",
                          str(c.max_deliver), str(c.max_ack_pending), actions.get(("consumer", c.durables()[0]), "?"))
    console.print(consumers)


async def run_dev(
    settings: Settings, topology: Topology, data_dir: Path, *, console: Console, exit_when_ready: bool = False,
    demo: bool = True, run_for: float | None = None, cluster: int = 1, services_only: bool = False,
    jobs_port: int | None = 8080,
) -> None:
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        console.print(f"starting embedded services in {data_dir} ...")
        embedded_db = settings.database_url is None
        started: list = []
        settings = start_embedded(settings, data_dir, stack, cluster=cluster, started=started)
        applied = await migrate.upgrade(settings.database_dsn())
        console.print(f"database: {len(applied)} migration(s) applied, schema up to date")
        changes, batched = await provision(settings, topology)
        describe(console, settings, topology, changes, batched)
        if exit_when_ready:
            console.print("[bold green]ready[/bold green]")
            return
        stop = asyncio.Event()
        stop_on_signals(stop)
        if services_only:
            await serve_only(settings, stop, console=console, run_for=run_for, embedded_db=embedded_db,
                             services=started)
            return
        log_file = stack.enter_context(open(data_dir / "seamq.log", "a"))
        configure_logging(settings.log_level, file=log_file)
        await run_workers(settings, topology, stop, console=console, demo=demo, run_for=run_for,
                          log_path=data_dir / "seamq.log", jobs_port=jobs_port, job_servers=cluster)
        console.print("stopped")


async def serve_only(settings: Settings, stop: asyncio.Event, *, console: Console, run_for: float | None,
                     embedded_db: bool, services: list = ()) -> None:
    """The services alone, for the user's own producers and workers: how to reach them, then watch
    them: one that exits by itself ends `seamq dev` with a coded error and its log's last lines."""
    dsn = settings.database_dsn()
    console.print("[bold green]ready[/bold green]: NATS and PostgreSQL, migrated and provisioned; in the shells of "
                  "your services and workers:", highlight=False)
    # Embedded PostgreSQL trusts loopback, so its URL holds no password; a URL of yours is not repeated.
    database = dsn if embedded_db else "(yours, as set)"
    console.print(f"export SEAMQ_DATABASE_URL={database}\nexport SEAMQ_NATS__URL={settings.nats.url}",
                  highlight=False, soft_wrap=True)
    console.print("Ctrl-C stops them.")
    deadline = asyncio.get_running_loop().time() + run_for if run_for else None
    while not stop.is_set() and (deadline is None or asyncio.get_running_loop().time() < deadline):
        for service in services:
            if not service.running:
                raise SeamqError(ErrorCode.EMBEDDED_SERVICE, service.ended())
        await sleep_unless_stopped(stop, 0.5)
    console.print("stopped")


async def run_workers(settings: Settings, topology: Topology, stop: asyncio.Event, *, console: Console,
                      demo: bool, run_for: float | None, log_path: Path, jobs_port: int | None = None,
                      job_servers: int = 1) -> None:
    """Relay, one consumer per topology consumer (each with its context's handler service), DLQ replay,
    `job_servers` job servers (when `jobs_port`, from that port on), demo, dashboard."""
    secret = secrets.token_hex(16)
    services = HandlerServices(sorted(topology.contexts), secret)
    await services.start()
    tasks = [asyncio.create_task(run_relay(settings, topology, stop)),
             asyncio.create_task(run_replay(settings, topology, stop))]
    for spec in topology.consumers.values():
        consumer_settings = settings.consumer.model_copy(
            update=dict(handler_url=services.urls[spec.target], handler_secret=SecretStr(secret)))
        tasks.append(asyncio.create_task(
            run_consumer(settings.model_copy(update={"consumer": consumer_settings}), topology, spec.name, stop)))
    helpers = [asyncio.create_task(dashboard(settings.database_dsn(), stop, console))]
    if demo:
        helpers.append(asyncio.create_task(workload(settings.database_dsn(), stop)))
    table = Table("handler service", "url", title="workers")
    for context, url in services.urls.items():
        table.add_row(context, url)
    if jobs_port is not None:
        from seamq.http.listen import listening_socket
        from seamq.jobs.serve import serve as serve_jobs

        # With a cluster, one job server per NATS node, as behind a load balancer in production: any
        # of them answers any request (docs/jobs.md, "Several servers"). A local runtime's webhook
        # receivers are local too.
        settings = settings.model_copy(update={"jobs": settings.jobs.model_copy(update={"webhook_private_addresses": True})})
        for n in range(job_servers):
            port = _port(jobs_port + n)
            sock = listening_socket("127.0.0.1", port)  # listening before "ready" is said
            tasks.append(asyncio.create_task(serve_jobs(settings, host="127.0.0.1", port=port, stop=stop, sock=sock)))
            table.add_row("job server (OJS)", f"http://127.0.0.1:{port}/ojs/v1")
            if n == 0:
                settings = settings.model_copy(update={"jobs": settings.jobs.model_copy(
                    update={"url": f"http://127.0.0.1:{port}"})})
    from seamq.console.serve import serve as serve_console
    from seamq.http.listen import listening_socket

    port = _port(settings.console.port)
    sock = listening_socket("127.0.0.1", port)
    tasks.append(asyncio.create_task(serve_console(settings, topology, host="127.0.0.1", port=port, stop=stop,
                                                   sock=sock)))
    table.add_row("console", f"http://127.0.0.1:{port}/")
    console.print(table)
    jobs = "" if jobs_port is None else ", job server" if job_servers == 1 else f", {job_servers} job servers"
    console.print(f"[bold green]ready[/bold green]: relay, {len(topology.consumers)} consumers, DLQ replay{jobs}"
                  f"{', demo workload' if demo else ''}; logs in {log_path}; Ctrl-C to stop")
    try:
        if run_for:
            if not await sleep_unless_stopped(stop, run_for):
                stop.set()
        else:
            await stop.wait()
    finally:
        stop.set()
        results = await asyncio.gather(*tasks, *helpers, return_exceptions=True)
        await services.stop()
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result
    console.print(render(*await stats(settings.database_dsn()), "seamq dev: final counts"))
