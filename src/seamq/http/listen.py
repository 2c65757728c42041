"""The listening socket of a seamq server (`seamq jobs serve`, `seamq console`), bound before anything else
starts, and the uvicorn server that serves it, each answer written in one send.

uvicorn, left to bind, says that a port is taken in a log line and exits 3, the code seamq
documents for destructive changes. Bound here first, a taken port or an address the machine
does not have is a coded error a person can act on, and uvicorn serves the socket it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seamq.http import SERVER_IDLE
from seamq.model import ErrorCode, SeamqError


def listening_socket(host: str, port: int) -> socket.socket:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # Named TCP (not the default protocol 0), so that asyncio turns Nagle off on each connection it
        # accepts: with protocol 0 it does not, and every answer written as headers then body waited
        # for the client's delayed ACK, 40 ms (measured: /ojs/v1/health took 44 ms, not 0.3).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(address)
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        return sock
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SeamqError(ErrorCode.PORT_IN_USE, f"{host}:{port} is in use by another process: stop it, or "
                             "choose another port (--port)") from None
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                         "(--host must be an address of this machine)") from None


class _OneSend:
    """A connection's transport that writes what one turn of the loop gave it in one send. uvicorn
    writes an answer's head and its body apart: two syscalls, two packets, and a client woken twice
    (measured on the job server, 20,000 jobs fetched and acked: its CPU per job 326 -> 304 us, the
    client's 135 -> 123, jobs/s +7%). Everything but `write` and `close` is the transport's own."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop, self._pending = transport, loop, []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._send)
        self._pending.append(data)

    def _send(self) -> None:
        data, self._pending = b"".join(self._pending), []
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._send()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class OneSendProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneSend(transport, self.loop))  # type: ignore[arg-type]


def config(app, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for a seamq server: quiet (seamq logs what matters), no lifespan, one send per answer,
    idle connections kept longer than clients keep them (seamq.http.SERVER_IDLE)."""
    return uvicorn.Config(app, host=host, port=port, http=OneSendProtocol, log_level="warning", access_log=False,
                          lifespan="off", timeout_keep_alive=SERVER_IDLE)


class EmbeddedServer(uvicorn.Server):
    """A server inside another program (`seamq dev`): its owner handles the signals and says when to stop."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def server(config: uvicorn.Config, stop: asyncio.Event | None) -> uvicorn.Server:
    """uvicorn on its own (its own signal handlers), or, with `stop`, until `stop` is set."""
    if stop is None:
        return uvicorn.Server(config)
    embedded = EmbeddedServer(config)
    asyncio.get_running_loop().create_task(_exit_on(stop, embedded))
    return embedded


async def _exit_on(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    server.should_exit = True
