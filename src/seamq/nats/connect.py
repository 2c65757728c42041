"""One place that turns NatsSettings into a live connection.

Everything connects through here (the workers, the CLI, the job server, the
Spark pipeline's driver and executors), so credentials, TLS and reconnect
policy are the same everywhere, and secrets are read only at connect time.
"""

from __future__ import annotations

import asyncio
import math
import random
import ssl
import time

import nats
from nats.aio.client import Client
from nats.aio.transport import TcpTransport

from seamq.observability import log
from seamq.settings import NatsSettings
from seamq.model import ErrorCode, SeamqError, describe

_CRLF = b"\r\n"
_RECONNECT_WAIT = 0.5  # seconds between attempts at one server


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's `Client._parse_header_lines`, giving the same dict for any bytes, faster.

    nats-py checks each header name for whitespace one character at a time in a
    generator: about 70 calls per message with seamq's headers, 14% of the
    consumer's CPU in a profile. A name holds whitespace exactly when `split()`
    does not give it back whole. tests/integration/messaging/test_nats_edges.py compares both on hostile input
    and fails if nats-py's function changes shape.
    """
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if key and key.split() != [key]:  # whitespace in the name (also what bytes.strip leaves, like \x1c)
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


NATS_PARSE_HEADER_LINES = Client._parse_header_lines  # nats-py's own, kept for the test
Client._parse_header_lines = staticmethod(parse_header_lines)

CLOSE_WAIT = 1.0  # seconds a lost connection may take to close before it is dropped


async def wait_closed_or_drop(self: TcpTransport) -> None:
    """nats-py's `TcpTransport.wait_closed`, bounded. Before it tries another server, nats-py
    closes the lost connection and waits for it to close; to a server cut off by the network,
    a connection holding unsent publishes closes only when the kernel gives up on it (16 s of a
    relay's 27 s stop, tests/cluster/messaging/test_network_partitions.py). Past CLOSE_WAIT it is dropped (abort)."""
    writer = self._io_writer
    if writer is None:
        return
    closing = asyncio.ensure_future(writer.wait_closed())
    done, _ = await asyncio.wait([closing], timeout=CLOSE_WAIT)
    if not done:
        writer.transport.abort()
    await closing


NATS_WAIT_CLOSED = TcpTransport.wait_closed  # nats-py's own, kept for the test
TcpTransport.wait_closed = wait_closed_or_drop


def _tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca or settings.tls_cert):
        return None
    context = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
    if settings.tls_cert:
        context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
    return context


class Outage:
    """The broker away, said once when it goes, reminded at a slowing interval, and said when it is
    back. nats-py reports each failed reconnect (every 0.5 s): logged as they came, an outage of a
    few minutes filled every worker's log with hundreds of the same line. Other errors (a slow
    consumer, a permission refused) are logged each time."""

    FIRST, MOST = 5.0, 300.0  # seconds to the first reminder; the longest between two

    def __init__(self, name: str, clock=time.monotonic) -> None:
        self.name, self.clock = name, clock
        self.client: Client | None = None
        self.since: float | None = None
        self.next_at = 0.0
        self.every = self.FIRST

    async def error(self, exc: Exception) -> None:
        if not isinstance(exc, _AWAY):
            log.warning("nats_error", client=self.name, error=describe(exc))
            return
        now = self.clock()
        if self.since is None:
            self.since, self.every, self.next_at = now, self.FIRST, now + self.FIRST
            log.warning("nats_unavailable", client=self.name, error=describe(exc))
        elif now >= self.next_at:
            log.warning("nats_still_unavailable", client=self.name, seconds=round(now - self.since), error=describe(exc))
            self.every = min(2 * self.every, self.MOST)
            self.next_at = now + self.every

    async def disconnected(self) -> None:
        """The connection went (a server that stopped answering pings says nothing else); not
        when it was closed on purpose."""
        if self.since is None and not (self.client and self.client.is_closed):
            now = self.clock()
            self.since, self.every, self.next_at = now, self.FIRST, now + self.FIRST
            log.warning("nats_unavailable", client=self.name, error="connection lost")

    async def reconnected(self) -> None:
        if self.since is not None:
            log.info("nats_reconnected", client=self.name, seconds=round(self.clock() - self.since, 1))
            self.since = None


class Rotation:
    """The next server nats-py tries after a connection is lost: the least tried first, the one just
    lost counting as tried once, so every other server comes before it; a server tried and failed
    waits _RECONNECT_WAIT before it is tried again. nats-py's own order tried the lost one first now
    and then (a shuffle), and always once the cluster's other servers were learned (they join its
    list after the first): a connect timeout on a server cut off by the network."""

    def __init__(self) -> None:
        self.on: str | None = None  # the server connected to, last time the connection was made

    def joined(self, client: Client) -> None:
        url = client.connected_url
        self.on = url.netloc if url else None

    def __call__(self, servers: list, info: dict) -> tuple:
        tried = lambda s: s.reconnects + (s.uri.netloc == self.on)  # noqa: E731 (the lost one: tried once)
        choice = min(servers, key=lambda s: (tried(s), random.random()))
        return choice, _RECONNECT_WAIT if choice.reconnects else 0.0


# What a broker that is away looks like to nats-py: the socket's errors and its own.
_AWAY = (OSError, asyncio.TimeoutError, nats.errors.NoServersError, nats.errors.StaleConnectionError,
         nats.errors.UnexpectedEOF, nats.errors.ConnectionClosedError)


def broker_away(exc: BaseException) -> bool:
    """An error of nats-py's, or of the socket under it: a page that read NATS says NATS is away."""
    return isinstance(exc, (nats.errors.Error, OSError, TimeoutError))


def coded(exc: BaseException) -> SeamqError | None:
    """A command's failure to reach NATS as a person can act on it; None when it is none."""
    if isinstance(exc, (nats.errors.NoServersError, OSError)):
        return SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"cannot reach NATS: {exc} (check SEAMQ_NATS__URL)")
    return None


async def connect(settings: NatsSettings, *, name: str = "seamq", persistent: bool = True, **callbacks) -> Client:
    """Connect. Workers (`persistent`) wait `startup_wait` for a broker that is not up yet, then
    fail (their supervisor restarts them, and a wrong URL is said rather than waited on forever);
    once connected they reconnect forever, riding out broker restarts. One-shot commands fail fast."""
    secret = lambda s: s.get_secret_value() if s else None  # noqa: E731
    outage, rotation = Outage(name), Rotation()

    async def reconnected() -> None:
        rotation.joined(client)
        await outage.reconnected()

    options = dict(
        servers=[s.strip() for s in settings.url.split(",")],
        reconnect_to_server_handler=rotation,
        name=name,
        connect_timeout=settings.connect_timeout,
        max_reconnect_attempts=max(1, math.ceil(settings.startup_wait / _RECONNECT_WAIT)) if persistent else 2,
        reconnect_time_wait=_RECONNECT_WAIT,
        ping_interval=settings.ping_interval,
        max_outstanding_pings=2,
        user=settings.user,
        password=secret(settings.password),
        token=secret(settings.token),
        user_credentials=str(settings.creds_file) if settings.creds_file else None,
        nkeys_seed=str(settings.nkey_seed_file) if settings.nkey_seed_file else None,
        tls=_tls_context(settings),
        error_cb=outage.error,
        disconnected_cb=outage.disconnected,
        reconnected_cb=reconnected,
        **callbacks,
    )
    client = outage.client = await nats.connect(**{k: v for k, v in options.items() if v is not None})
    rotation.joined(client)
    if persistent:
        client.options["max_reconnect_attempts"] = -1  # read on every reconnect: from now on, forever
    return client
