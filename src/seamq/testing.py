"""A testing kit for seamq users: a pytest plugin, enabled with one line in a conftest.py:

    pytest_plugins = ["seamq.testing"]

    async def test_on_vibe_created(seamq_harness):
        outcome = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1"))
        assert outcome.acked and outcome.committed

`seamq_harness` needs no services: it builds the message the relay would
publish and hands it to the real consumer (seamq.consumer.InboxConsumer)
over in-memory ports (seamq.memory), which parses it, runs the handler inside
a transaction (the test's own PostgreSQL connection, or an in-memory one that
records statements) and decides ACK, retry or dead letter, so a test sees
what production would do: the kit has no rules of its own to drift from it.
`deliver_http` does the same for an HTTP handler service: the consumer's
request goes to the service's ASGI app in process (no server, no port) and
its answer is read with the consumer's own mapping. For tests that
do want the real thing, `seamq_nats`, `seamq_postgres`, `seamq_database` (a
migrated database of the test's own) and `seamq_topology` (provisioned)
start embedded services on free ports, once per session, and remove them
afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import shutil
import tempfile
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from seamq.consumer import InboxConsumer
from seamq.envelope import Envelope, HandlerResult, Rejected, parse_message
from seamq.memory import MemoryDeliveries, MemoryLaneWork, MemoryPublisher, MemoryTransaction, NoInbox
from seamq.model import Event, OutMessage, message_headers, traceparent_for
from seamq.registry import Registry, import_object
from seamq.settings import ConsumerSettings
from seamq.topology import MAX_DELIVER, ConsumerSpec
from seamq.typed import EventModel, payload_json
from seamq.verdict import Ack, DeadLetter, Duplicate, Nak, Verdict

__all__ = ["Delivered", "Harness", "MemoryTransaction"]


@dataclass(frozen=True)
class Delivered:
    """What the consumer did with one delivery, and what the handler saw."""

    verdict: Verdict
    envelope: Envelope | None  # as the handler received it (payload typed for a typed handler)
    result: HandlerResult | None  # the handler's, None when it was not called
    committed: bool  # the handler's transaction committed (only with an ACK)
    statements: list = field(default_factory=list)  # what it executed, with the in-memory transaction
    dead_letter: OutMessage | None = None  # the dead letter as the consumer published it (EVT-047-002)

    @property
    def acked(self) -> bool:
        return isinstance(self.verdict, (Ack, Duplicate))

    @property
    def retried(self) -> bool:
        return isinstance(self.verdict, Nak)

    @property
    def dead_lettered(self) -> bool:
        return isinstance(self.verdict, DeadLetter)

    @property
    def reason(self) -> str | None:
        """The dead letter's reason (`schema_mismatch`, `handler_rejected`, `max_deliver`, ...)."""
        return self.verdict.reason.value if isinstance(self.verdict, DeadLetter) else None

    @property
    def detail(self) -> str | None:
        verdict = self.verdict
        return verdict.detail if isinstance(verdict, DeadLetter) else getattr(verdict, "error", None)


class Harness:
    """Drives handlers through the real consumer, one delivery at a time."""

    def __init__(self, *, max_deliver: int | None = None, handler_timeout: float | None = None) -> None:
        self.settings = ConsumerSettings()
        self.max_deliver = max_deliver or MAX_DELIVER
        self.handler_timeout = handler_timeout or self.settings.handler_timeout

    @staticmethod
    def message(event: Event | EventModel) -> tuple[str, dict[str, str], bytes]:
        """(subject, headers, body) as the relay publishes the event."""
        if isinstance(event, EventModel):
            event = event.event()
        body = json.dumps(payload_json(event), separators=(",", ":")).encode()
        return str(event.subject), message_headers(event, traceparent_for(event.id)), body

    async def deliver(self, handler: Callable | Registry, event: Event | EventModel | None = None, *,
                      conn: Any = None, delivered: int = 1, message: tuple[str, dict, bytes] | None = None,
                      source: str | None = None, context: str | None = None) -> Delivered:
        """Deliver `event` (or a raw `message`: subject, headers, bytes) for the `delivered`-th time
        to a handler function, or to the route a Registry has for it. With `conn` (an async psycopg
        connection) the handler runs in a transaction on it, rolled back unless ACKed."""
        from seamq.wiring import build_handlers

        message = message or self.message(event)
        seen: list[Envelope] = []
        if not isinstance(handler, Registry):
            handler = Registry(routes=(), default=handler)
        registry = Registry(routes=tuple(dataclasses.replace(r, handler=_spy(r.handler, seen)) for r in handler.routes),
                            default=_spy(handler.default, seen) if handler.default else None)
        origin = _context(message)
        lookup = build_handlers(registry, timeout=self.handler_timeout, source=source or origin, target=context)
        memory = MemoryTransaction() if conn is None else None
        return await self._through_consumer(message, origin, delivered, lookup, _KitInbox(conn or memory), seen,
                                            memory.statements if memory else [])

    async def deliver_http(self, app: Any, event: Event | EventModel | None = None, *, path: str = "/handle",
                           secret: str | None = None, delivered: int = 1,
                           message: tuple[str, dict, bytes] | None = None) -> Delivered:
        """Deliver `event` (or a raw `message`) to an HTTP handler service, given as its ASGI app
        (`seamq.http.server.handler_app`, or any FastAPI or Starlette app): the POST the consumer
        sends (signed with `secret`, carrying the trace), called in process, and its answer read as
        the consumer reads it. The app's lifespan is not run: start what it needs in the test."""
        service = _AsgiService(app, path, secret, self.handler_timeout)
        message = message or self.message(event)
        return await self._through_consumer(message, _context(message), delivered, lambda t, v: service,
                                            _KitInbox(None), [], [])

    async def _through_consumer(self, message, origin: str | None, delivered: int, lookup, inbox: "_KitInbox",
                                seen: list, statements: list) -> Delivered:
        """`origin`: the context the message comes from, as its subject says (None: not an event's)."""
        subject, headers, body = message
        context = origin or "testing"
        spec = ConsumerSpec(name="seamq-testing", target=context, source=context, stream="TESTING",
                            filter_subject=subject, ack_wait=30, max_deliver=self.max_deliver, max_ack_pending=1,
                            partitions=0, pinned_ttl=30, replicas=1)
        deliveries, dlq = MemoryDeliveries(redeliver=False), MemoryPublisher()
        results: list[HandlerResult] = []
        consumer = InboxConsumer(spec, deliveries, inbox, dlq, _Recorded.lookup(lookup, results), self.settings)
        (done,) = await consumer.handle([deliveries.publish(subject, headers, body, delivered)])
        verdict = done.verdict
        return Delivered(verdict, seen[0] if seen else done.item.envelope, results[-1] if results else None,
                         isinstance(verdict, Ack) and bool(results), statements,
                         dlq.published[-1] if dlq.published else None)


def _context(message: tuple[str, dict, bytes]) -> str | None:
    """The context a message comes from (as its subject says), for the routes that name a source."""
    parsed = parse_message(*message, 1)
    return None if isinstance(parsed, Rejected) else parsed.context


class _KitInbox(NoInbox):
    """The consumer's inbox port for one delivery: attempts are the delivery's (nothing is recorded,
    as in at-least-once mode), and the lane's transaction is the test's connection, or `memory`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @asynccontextmanager
    async def transaction(self):
        if self.conn is None or isinstance(self.conn, MemoryTransaction):
            yield MemoryLaneWork(self.conn)
            return
        from seamq.pg.inbox_repo import lane_transaction

        async with lane_transaction(self.conn) as work:
            yield work


class _Recorded:
    """A handler whose results are noted, in order (the kit's `result` is the last one)."""

    def __init__(self, handler: Any, results: list) -> None:
        self.handler, self.results, self.transactional = handler, results, handler.transactional

    @classmethod
    def lookup(cls, lookup: Callable, results: list) -> Callable:
        def recorded(event_type: str, version: int):
            handler = lookup(event_type, version)
            return None if handler is None else cls(handler, results)
        return recorded

    async def __call__(self, envelope: Envelope, conn: Any, traceparent: str | None = None) -> HandlerResult:
        result = await self.handler(envelope, conn, traceparent)
        self.results.append(result)
        return result


class _AsgiService:
    """An HTTP handler service called in process: the consumer's request to its ASGI app, and its
    answer read as the consumer reads it."""

    transactional = False

    def __init__(self, app: Any, path: str, secret: str | None, timeout: float) -> None:
        self.app, self.path, self.secret, self.timeout = app, path, secret, timeout

    async def __call__(self, envelope: Envelope, conn: Any, traceparent: str | None = None) -> HandlerResult:
        from seamq.http.client import request_of, result_of  # httptools: imported only by tests that use it

        data, headers = request_of(envelope, secret=self.secret, traceparent=traceparent)
        try:
            status, text = await asyncio.wait_for(_post(self.app, self.path, data, headers), self.timeout)
        except asyncio.TimeoutError:
            return HandlerResult.timed_out(self.timeout)
        return result_of(status, text)


def _spy(target: str | Callable, seen: list) -> str | Callable:
    """The handler function, noting the envelope it receives; typed like the function it wraps."""
    if isinstance(target, str):
        if target.startswith(("http://", "https://")):
            raise ValueError(f"the harness runs in-process handlers, not {target}")
        target = import_object(target)

    @functools.wraps(target)
    async def spy(envelope, conn):
        seen.append(envelope)
        return await target(envelope, conn)

    return spy


async def _post(app: Any, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """One POST to an ASGI app, as a server would make it: (status, body text). An exception the
    app lets out before it answered is a 500, as uvicorn would send."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
             "headers": [(name.lower().encode(), value.encode()) for name, value in
                         {**headers, "content-length": str(len(body)), "host": "127.0.0.1"}.items()]}
    answered = asyncio.Event()
    request = [{"type": "http.request", "body": body, "more_body": False}]
    status: int | None = None
    chunks: list[bytes] = []

    async def receive() -> dict:
        if request:
            return request.pop()
        await answered.wait()  # the client stays until the answer is complete, then goes
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception:
        if status is None:
            return 500, "Internal Server Error"
    return status or 500, b"".join(chunks).decode(errors="replace")


# -- pytest fixtures -------------------------------------------------------------------------------

@pytest.fixture
def seamq_harness() -> Harness:
    """Drive handlers as the consumer would, with no services (see Harness.deliver)."""
    return Harness()


@pytest.fixture(scope="session")
def seamq_nats():
    """An embedded nats-server with JetStream on a free port, for the session; `.url` to connect."""
    from seamq.embedded import NatsServer

    root = Path(tempfile.mkdtemp(prefix="seamq-test-nats-"))
    server = NatsServer(root / "nats")
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def seamq_postgres():
    """An embedded PostgreSQL on a free port, for the session, with a migrated template database."""
    import asyncio

    from seamq.embedded import PostgresServer
    from seamq.pg import migrate

    root = Path(tempfile.mkdtemp(prefix="seamq-test-pg-"))
    server = PostgresServer(root / "data", durable=False)
    server.start()
    try:
        asyncio.run(migrate.upgrade(server.create_database(_TEMPLATE)))
        yield server
    finally:
        server.remove_data()
        shutil.rmtree(root, ignore_errors=True)


_TEMPLATE = "seamq_testing_template"


@pytest.fixture
def seamq_database(seamq_postgres) -> str:
    """The URL of a migrated database of this test's own (outbox, inbox), dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = seamq_postgres.create_database(name, template=_TEMPLATE)
    yield url
    seamq_postgres.drop_database(name)


@pytest.fixture
def seamq_topology(seamq_nats):
    """The topology (SEAMQ_TOPOLOGY_FILE, else seamq's default) provisioned on `seamq_nats`."""
    import asyncio

    from seamq.nats.connect import connect
    from seamq.nats.provision import apply
    from seamq.settings import NatsSettings, Settings
    from seamq.topology import load_topology

    topology = load_topology(Settings().topology_file)

    async def provision() -> None:
        nc = await connect(NatsSettings(url=seamq_nats.url), name="seamq-testing")
        try:
            await apply(nc.jetstream(), topology)
        finally:
            await nc.close()

    asyncio.run(provision())
    return topology
