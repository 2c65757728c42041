"""The listening socket of a seamq server (`seamq jobs serve`), bound before anything else starts.

uvicorn, left to bind, says that a port is taken in a log line and exits 3, the code seamq
documents for destructive changes. Bound here first, a taken port or an address the machine
does not have is a coded error a person can act on, and uvicorn serves the socket it is given.
"""

from __future__ import annotations

import errno
import socket

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
