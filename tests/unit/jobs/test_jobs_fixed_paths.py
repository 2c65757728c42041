"""seamq.jobs.api.FixedPaths: a request to a route without path parameters answered straight by its
endpoint, and every request answered as Starlette alone answers it (errors by the handler of their
nearest type, a wrong method, a path with a parameter, an unknown path)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from seamq.jobs.api import FixedPaths


class Refused(Exception):
    pass


class RefusedHarder(Refused):
    pass


async def fine(request: Request) -> Response:
    return JSONResponse({"body": (await request.body()).decode(), "id": request.path_params.get("id")})


async def refused(request: Request) -> Response:
    raise RefusedHarder("no")


async def broken(request: Request) -> Response:
    raise KeyError("gone")


ROUTES = [Route("/fine", fine, methods=["POST"]), Route("/refused", refused, methods=["POST"]),
          Route("/broken", broken, methods=["POST"]), Route("/item/{id}", fine, methods=["GET"])]


async def refusal(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": type(exc).__name__}, 409)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.status_code}, exc.status_code)


async def crash(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "crash"}, 500)


HANDLERS = {Refused: refusal, HTTPException: http_error, Exception: crash}
REQUESTS = [("POST", "/fine", b"hello"), ("POST", "/refused", b""), ("POST", "/broken", b""),
            ("GET", "/fine", b""), ("GET", "/item/7", b""), ("GET", "/nowhere", b""), ("DELETE", "/item/7", b"")]


class Counted:
    """Starlette's app, counting the requests that reach it."""

    def __init__(self, app) -> None:
        self.app, self.reached = app, 0

    async def __call__(self, scope, receive, send) -> None:
        self.reached += 1
        await self.app(scope, receive, send)


async def answers(app) -> list[tuple[int, bytes]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t") as client:
        return [((said := await client.request(method, path, content=body)).status_code, said.content)
                for method, path, body in REQUESTS]


async def test_every_request_is_answered_as_starlette_alone_answers_it():
    alone = await answers(Starlette(routes=ROUTES, exception_handlers=HANDLERS))
    starlette = Counted(Starlette(routes=ROUTES, exception_handlers=HANDLERS))
    assert await answers(FixedPaths(starlette, ROUTES, HANDLERS)) == alone
    assert [status for status, _ in alone] == [200, 409, 500, 405, 200, 404, 405]
    assert starlette.reached == 4  # a wrong method, a path's parameter, an unknown path, a wrong method


@pytest.mark.parametrize("fixed", [False, True], ids=["starlette", "fixed_paths"])
async def test_an_error_only_the_last_resort_takes_is_answered_and_goes_on_to_the_server_to_be_logged(fixed):
    app = Starlette(routes=ROUTES, exception_handlers=HANDLERS)
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    with pytest.raises(KeyError):
        await (FixedPaths(app, ROUTES, HANDLERS) if fixed else app)(
            {"type": "http", "method": "POST", "path": "/broken", "headers": [], "query_string": b""}, _nothing, send)
    assert sent[0]["status"] == 500 and sent[1]["body"] == b'{"error":"crash"}'


async def _nothing() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}
