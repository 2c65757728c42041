"""One place that turns NatsSettings into a live connection.

Everything connects through here (the workers, the CLI, the job server, the
Spark pipeline's driver and executors), so credentials, TLS and reconnect
policy are the same everywhere, and secrets are read only at connect time.
"""

from __future__ import annotations

import math
import ssl

import nats
from nats.aio.client import Client

from seamq.observability import log
from seamq.settings import NatsSettings
from seamq.model import describe

_CRLF = b"\r\n"
_RECONNECT_WAIT = 0.5  # seconds between attempts at one server


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's `Client._parse_header_lines`, giving the same dict for any bytes, faster.

    nats-py checks each header name for whitespace one character at a time in a
    generator: about 70 calls per message with seamq's headers, 14% of the
    consumer's CPU in a profile. A name holds whitespace exactly when `split()`
    does not give it back whole. tests/test_nats_edges.py compares both on hostile input
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


def _tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca or settings.tls_cert):
        return None
    context = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
    if settings.tls_cert:
        context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
    return context


async def _log_error(exc: Exception) -> None:
    # nats-py's default prints a traceback per failed attempt; one line is enough.
    log.warning("nats_error", error=describe(exc))


async def connect(settings: NatsSettings, *, name: str = "seamq", persistent: bool = True, **callbacks) -> Client:
    """Connect. Workers (`persistent`) wait `startup_wait` for a broker that is not up yet, then
    fail (their supervisor restarts them, and a wrong URL is said rather than waited on forever);
    once connected they reconnect forever, riding out broker restarts. One-shot commands fail fast."""
    secret = lambda s: s.get_secret_value() if s else None  # noqa: E731
    options = dict(
        servers=[s.strip() for s in settings.url.split(",")],
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
        error_cb=_log_error,
        **callbacks,
    )
    client = await nats.connect(**{k: v for k, v in options.items() if v is not None})
    if persistent:
        client.options["max_reconnect_attempts"] = -1  # read on every reconnect: from now on, forever
    return client
