"""A testing kit for seamq users: a pytest plugin, enabled with one line in a conftest.py:

    pytest_plugins = ["seamq.testing"]

    async def test_on_vibe_created(seamq_harness):
        outcome = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1"))
        assert outcome.acked and outcome.committed

`seamq_harness` needs no services: it builds the message the relay would
publish, parses it as the consumer does, runs the handler inside a
transaction (the test's own PostgreSQL connection, or an in-memory one that
records statements) and decides ACK, retry or dead letter with the
consumer's own rules (seamq.verdict), so a test sees what production would
do. `deliver_http` does the same for an HTTP handler service: it posts the
consumer's request to the service's ASGI app in process (no server, no
port) and reads the answer with the consumer's own mapping. For tests that
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from seamq.envelope import Envelope, HandlerResult, Reason, Rejected, parse_message
from seamq.model import Event, message_headers, traceparent_for
from seamq.registry import Registry, import_object
from seamq.settings import ConsumerSettings
from seamq.topology import MAX_DELIVER
from seamq.typed import EventModel, payload_json
from seamq.backoff import Backoff
from seamq.verdict import Ack, DeadLetter, Duplicate, Nak, Verdict, decide

__all__ = ["Delivered", "Harness", "MemoryTransaction"]


class MemoryTransaction:
    """Stands in for the consumer's database connection: records what the handler executes."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> "MemoryTransaction":
        self.statements.append((str(query), params))
        return self

    def cursor(self, *args: Any, **kwargs: Any) -> "MemoryTransaction":
        return self

    async def __aenter__(self) -> "MemoryTransaction":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def executemany(self, query: Any, params_seq: Any) -> None:
        for params in params_seq:
            self.statements.append((str(query), params))


@dataclass(frozen=True)
class Delivered:
    """What the consumer would do with one delivery, and what the handler saw."""

    verdict: Verdict
    envelope: Envelope | None  # as the handler received it (payload typed for a typed handler)
    result: HandlerResult | None  # the handler's, None when it was not called
    committed: bool  # the handler's transaction committed (only with an ACK)
    statements: list = field(default_factory=list)  # what it executed, with the in-memory transaction

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
    """Drives in-process handlers as the consumer would, one delivery at a time."""

    def __init__(self, *, max_deliver: int | None = None, handler_timeout: float | None = None) -> None:
        defaults = ConsumerSettings()
        self.max_deliver = max_deliver or MAX_DELIVER
        self.handler_timeout = handler_timeout or defaults.handler_timeout
        self.backoff = Backoff(defaults.nak_base, defaults.nak_max)

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
        subject, headers, body = message or self.message(event)
        parsed = parse_message(subject, headers, body, delivered)
        if isinstance(parsed, Rejected):
            return self._decided(None, None, parsed, delivered, False, [])
        seen: list[Envelope] = []
        call = self._handler(handler, parsed, source or parsed.context, seen, context)
        if call is None:
            return self._decided(parsed, None, Rejected(Reason.NO_HANDLER, f"no handler for {parsed.subject}"),
                                 delivered, False, [])
        memory = MemoryTransaction() if conn is None else None
        result = await call(parsed, memory) if memory else await self._in_transaction(conn, call, parsed)
        return self._decided(seen[0] if seen else parsed, result, None, delivered, result.done,
                             memory.statements if memory else [])

    async def deliver_http(self, app: Any, event: Event | EventModel | None = None, *, path: str = "/handle",
                           secret: str | None = None, delivered: int = 1,
                           message: tuple[str, dict, bytes] | None = None) -> Delivered:
        """Deliver `event` (or a raw `message`) to an HTTP handler service, given as its ASGI app
        (`seamq.http.server.handler_app`, or any FastAPI or Starlette app): the POST the consumer
        sends (signed with `secret`, carrying the trace), called in process, and its answer read as
        the consumer reads it. The app's lifespan is not run: start what it needs in the test."""
        from seamq.http.client import request_of, result_of  # aiohttp: imported only by tests that use it

        subject, headers, body = message or self.message(event)
        parsed = parse_message(subject, headers, body, delivered)
        if isinstance(parsed, Rejected):
            return self._decided(None, None, parsed, delivered, False, [])
        data, request_headers = request_of(parsed, secret=secret, traceparent=headers.get("traceparent"))
        try:
            status, text = await asyncio.wait_for(_post(app, path, data, request_headers), self.handler_timeout)
        except asyncio.TimeoutError:
            result = HandlerResult.timed_out(self.handler_timeout)
        else:
            result = result_of(status, text)
        return self._decided(parsed, result, None, delivered, result.done, [])

    def _handler(self, handler: Callable | Registry, envelope: Envelope, source: str, seen: list,
                 context: str | None):
        from seamq.wiring import build_handlers

        if not isinstance(handler, Registry):
            handler = Registry(routes=(), default=handler)
        registry = Registry(routes=tuple(dataclasses.replace(r, handler=_spy(r.handler, seen)) for r in handler.routes),
                            default=_spy(handler.default, seen) if handler.default else None)
        return build_handlers(registry, timeout=self.handler_timeout, source=source, target=context)(
            envelope.event_type, envelope.event_version)

    @staticmethod
    async def _in_transaction(conn, call, envelope: Envelope) -> HandlerResult:
        try:
            async with conn.transaction():
                result = await call(envelope, conn)
                if not result.done:
                    raise _Rollback(result)
                return result
        except _Rollback as rollback:
            return rollback.result

    def _decided(self, envelope, result, rejected, delivered, committed, statements) -> Delivered:
        verdict = decide(duplicate=False, rejected=rejected, hold=None, result=result, attempt=delivered,
                         max_deliver=self.max_deliver, backoff=self.backoff)
        return Delivered(verdict, envelope, result, committed, statements)


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


class _Rollback(Exception):
    def __init__(self, result: HandlerResult) -> None:
        self.result = result


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
