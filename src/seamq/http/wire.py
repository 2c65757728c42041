"""A lean HTTP/1.1 client for the consumer's handler calls (SDS-047 §12: POST to a handler service).

Why not aiohttp, which the rest of seamq calls HTTP with: its request path (a request and a response
object, a writer task, a payload wrapper, per-request timers and header multidicts) cost the consumer
more CPU per message than everything else it does for that message, measured in docs/benchmarks.md
(section 4). The wire is the same: one keep-alive connection per call in flight, the request head and
body written in one send, the answer parsed by httptools (llhttp, the parser uvicorn serves with).

It does what a handler call needs and no more: http and https, a total timeout per call (connecting
included), keep-alive pools that drop a connection idle for `seamq.http.CLIENT_IDLE`, at most `limit`
connections per origin. No redirects (a handler answers, it does not move: a 3xx is a retry, as any
status the contract does not name), no proxies, cookies or compression. An answer's body is kept up
to MAX_ANSWER bytes: the consumer reads 500 characters of it at most, and a huge one must not cost
memory.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from urllib.parse import quote, unquote, urlsplit

import httptools

from seamq.http import CLIENT_IDLE

MAX_ANSWER = 64 * 1024
_URL_SAFE = "/?&=%:@!$'()*+,;~"  # kept as written in a path and query; anything else is percent-encoded


class Unreachable(Exception):
    """The call got no complete answer: the connection failed, closed, or spoke something not HTTP."""


class Target:
    """A handler URL, parsed once: where to connect and the request head every call starts with."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default = parts.port is None
        host = f"[{self.host}]" if ":" in self.host else self.host.encode("idna").decode()
        path = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_URL_SAFE)
        self.origin = (parts.scheme, self.host, self.port)
        head = f"POST {path} HTTP/1.1\r\nHost: {host}{'' if default else f':{self.port}'}\r\nUser-Agent: seamq\r\n"
        if parts.username is not None:  # http://user:password@host/...: Basic authentication, as aiohttp sent
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            head += f"Authorization: Basic {base64.b64encode(pair).decode()}\r\n"
        self.head = head.encode("latin-1")


class HandlerClient:
    """Pooled keep-alive connections to handler services (create it inside the event loop)."""

    def __init__(self, limit: int = 64, idle: float = CLIENT_IDLE) -> None:
        self.limit, self.idle = limit, idle
        self._pools: dict[tuple, _Pool] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, target: Target, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        """(status, body) of the answer; raises Unreachable, OSError or TimeoutError."""
        pool = self._pools.get(target.origin) or self._pool(target)
        request = b"".join((target.head, *(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()),
                            b"Content-Length: %d\r\n\r\n" % len(body), body))
        deadline = pool.loop.time() + timeout
        conn = pool.take_idle() or await asyncio.wait_for(pool.take(), timeout)
        try:
            return await conn.exchange(request, deadline)
        finally:
            pool.give_back(conn)

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, target: Target) -> "_Pool":
        if target.tls and self._tls is None:
            self._tls = ssl.create_default_context()
        pool = self._pools[target.origin] = _Pool(target, self._tls if target.tls else None, self.limit, self.idle)
        return pool


class _Pool:
    """One origin's connections: the idle ones (most recently used taken first) and a count of all."""

    def __init__(self, target: Target, tls: ssl.SSLContext | None, limit: int, idle: float) -> None:
        self.target, self.tls, self.limit, self.idle_for = target, tls, limit, idle
        self.idle: deque[_Connection] = deque()
        self.count = 0
        self.closed = False
        self.waiting: deque[asyncio.Future] = deque()
        self.loop = asyncio.get_running_loop()

    def take_idle(self) -> "_Connection | None":
        """The most recently used idle connection still open and fresh, if there is one."""
        now = self.loop.time()
        while self.idle and now - self.idle[0].since > self.idle_for:  # the oldest first: stale ones go
            self._drop(self.idle.popleft())
        while self.idle:
            conn = self.idle.pop()
            if conn.usable:
                return conn
            self._drop(conn)  # closed by the server while idle
        return None

    async def take(self) -> "_Connection":
        """A new connection, or one handed back, when the limit lets (take_idle found none)."""
        while self.count >= self.limit:
            waiter = self.loop.create_future()
            self.waiting.append(waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():  # handed over as we gave up: pass it on
                    if waiter.result() is None:
                        self._wake(None)
                    else:
                        self.give_back(waiter.result())
                raise
            if conn is not None:
                return conn
        self.count += 1
        try:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self.loop), self.target.host, self.target.port, ssl=self.tls,
                server_hostname=self.target.host if self.tls else None)
        except BaseException:
            self.count -= 1
            self._wake(None)
            raise
        return conn

    def give_back(self, conn: "_Connection") -> None:
        if not conn.reusable or self.closed:
            self._drop(conn)
            return
        conn.since = self.loop.time()
        if not self._wake(conn):
            self.idle.append(conn)

    def _drop(self, conn: "_Connection") -> None:
        conn.close()
        self.count -= 1
        self._wake(None)

    def _wake(self, conn: "_Connection | None") -> bool:
        """Hands `conn` (or, with None, a free place) to the first caller still waiting."""
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def close(self) -> None:
        self.closed = True  # a connection still in a call is closed when it comes back
        while self.idle:
            self._drop(self.idle.pop())


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.body: list[bytes] = []
        self.kept = 0
        self.status = 0  # of the answer whose head has come in
        self.reusable = False
        self.since = 0.0

    def exchange(self, request: bytes, deadline: float) -> asyncio.Future:
        if not self.usable:  # closed by the server since it was handed over
            raise Unreachable("the server closed the connection before the request")
        self.reusable = False  # until a whole answer says it may be
        self.body, self.kept, self.status = [], 0, 0
        self.waiter = self.loop.create_future()
        # A timer handle, not asyncio.timeout: a third of the cost, and a late answer cannot be taken
        # for the next call's, since the connection is closed with the call.
        self.timer = self.loop.call_at(deadline, self._expire)
        self.transport.write(request)
        return self.waiter

    @property
    def usable(self) -> bool:
        """Connected and not closing (closed by either side: between a server's FIN and connection_lost,
        asyncio would drop a write)."""
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.reusable = False
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()

    def _expire(self) -> None:
        self._settle(TimeoutError())
        self.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # a server speaking out of turn is not trusted with another call
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._settle(Unreachable(f"the answer is not HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.status >= 200:  # the head came, so it answered (and a body that runs to the close ends)
            self._settle((self.status, b"".join(self.body)))
        else:
            self._settle(Unreachable(f"the server closed the connection{f' ({exc})' if exc else ''} "
                                     "before answering"))

    # httptools' callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.kept < MAX_ANSWER:
            self.body.append(body[:MAX_ANSWER - self.kept])
            self.kept += len(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 1xx (103 Early Hints...): the answer is still to come
            self.body, self.kept, self.status = [], 0, 0
            return
        self.reusable = self.waiter is not None and self.parser.should_keep_alive()
        self._settle((self.status, b"".join(self.body)))

    def _settle(self, outcome: tuple[int, bytes] | Exception) -> None:
        if self.timer is not None:
            self.timer.cancel()
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():  # nobody asked, or the caller gave up
            return
        if isinstance(outcome, Exception):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)
