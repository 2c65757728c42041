"""The FastAPI handler service the HTTP benchmark calls (run by uvicorn in its own process)."""

from seamq.http.server import handler_app


async def noop(envelope) -> None:
    return None


app = handler_app(noop, secret=None)
