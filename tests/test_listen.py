"""The listening socket of seamq's servers: a connection it accepts sends small answers at once."""

from __future__ import annotations

import asyncio
import socket

from seamq.http.listen import listening_socket


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
