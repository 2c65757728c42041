"""HTTP adapter: the SDS-047 §12 handler contract, both sides."""

# Idle keep-alive connections, both sides. A client that sends on a connection the server closed for
# idling gets "server disconnected", and a POST cannot be sent again safely. So seamq's clients
# (the consumer's handler calls, the jobs client) drop an idle connection sooner than common servers
# do (gunicorn 2 s, uvicorn and Node 5 s), and seamq's servers keep one longer than common client
# pools (aiohttp 15 s, httpx 5 s, Node 4-5 s; nginx's 75 s).
CLIENT_IDLE = 1.5  # seconds
SERVER_IDLE = 75  # seconds
