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
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SeamqError(ErrorCode.PORT_IN_USE, f"{host}:{port} is in use by another process: stop it, or "
                             "choose another port (--port)") from None
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                         "(--host must be an address of this machine)") from None
