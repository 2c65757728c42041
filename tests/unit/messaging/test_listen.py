"""The listening socket of seamq's servers: a connection it accepts sends small answers at once."""

from __future__ import annotations

import asyncio
import socket

from seamq.http.listen import _OneSend, listening_socket


async def test_accepted_connections_have_nagle_off():
    """With Nagle on, an answer written as headers then body waited for the client's delayed ACK
    (40 ms a request, measured on `seamq jobs serve`); asyncio turns it off only on TCP sockets
    that say so."""
    sock = listening_socket("127.0.0.1", 0)
    accepted = asyncio.get_running_loop().create_future()

    async def on_connect(reader, writer):
        accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


class _Recording:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str):
        return f"info {name}"


async def test_what_one_turn_of_the_loop_writes_is_sent_at_once_and_a_close_sends_what_waits():
    """uvicorn writes an answer's head and its body apart: two sends, two packets, a client woken twice."""
    sent = _Recording()
    transport = _OneSend(sent, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"{}")
    assert sent.writes == []
    await asyncio.sleep(0)
    assert sent.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"] and transport.get_extra_info("peername") == "info peername"
    transport.write(b"last")
    transport.close()
    assert sent.writes[-1] == b"last" and sent.closed
    await asyncio.sleep(0)
    assert len(sent.writes) == 2  # nothing sent twice, nothing after the close


async def test_seamqs_servers_keep_idle_connections_longer_than_its_clients_and_common_pools_do():
    """A client sending on a connection the server closed for idling gets "server disconnected", and a
    POST cannot be sent again safely: seamq's side of each pair gives way first."""
    from seamq.http import CLIENT_IDLE
    from seamq.http.client import http_client
    from seamq.http.listen import config
    from seamq.jobs.client import JobsClient

    assert config(None, "127.0.0.1", 8080).timeout_keep_alive > 15  # aiohttp's pool keeps one 15 s
    assert CLIENT_IDLE < 2  # gunicorn closes one after 2 s, uvicorn after 5
    handlers = http_client()  # tests/integration/messaging/test_http_wire.py shows it drops a connection idle that long
    async with JobsClient("http://127.0.0.1:1") as jobs:
        idle = [handlers.idle, jobs._session.connector._keepalive_timeout]
    await handlers.close()
    assert idle == [CLIENT_IDLE, CLIENT_IDLE]
