"""The consumer side of SDS-047 §12: POST /handle with the REQ-058 envelope.

Status codes map to outcomes: 200 ok, 409 already processed, 422 poison;
5xx, timeouts, connection errors and any other status mean "try again"
(a 401 from a wrong shared secret must not dead-letter good messages).
"""

from __future__ import annotations

import json

import httpx

from seamq.envelope import Envelope, HandlerResult, Outcome
from seamq.http.signing import SIGNATURE_HEADER, sign

_OUTCOMES = {200: Outcome.OK, 201: Outcome.OK, 202: Outcome.OK, 204: Outcome.OK,
             409: Outcome.ALREADY_PROCESSED, 422: Outcome.POISON}


def http_client(max_connections: int = 64) -> httpx.AsyncClient:
    """One pooled keep-alive client per consumer process."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=max_connections,
                                                 max_keepalive_connections=max_connections))


class HttpHandler:
    transactional = False

    def __init__(self, url: str, *, client: httpx.AsyncClient, secret: str | None = None,
                 timeout: float = 10.0) -> None:
        self.url, self.client, self.secret, self.timeout = url, client, secret, timeout

    def __repr__(self) -> str:
        return f"HttpHandler({self.url})"

    async def __call__(self, envelope: Envelope, conn=None, traceparent: str | None = None) -> HandlerResult:
        body = json.dumps(envelope.to_json(), separators=(",", ":")).encode()
        headers = {"content-type": "application/json"}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, body)
        if traceparent:
            headers["traceparent"] = traceparent
        try:
            response = await self.client.post(self.url, content=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException:
            return HandlerResult(Outcome.RETRY, f"handler timed out after {self.timeout:g}s")
        except httpx.TransportError as exc:
            return HandlerResult(Outcome.RETRY, f"handler unreachable: {type(exc).__name__}: {exc}")
        outcome = _OUTCOMES.get(response.status_code, Outcome.RETRY)
        detail = None if outcome == Outcome.OK else f"HTTP {response.status_code}: {response.text[:500]}"
        return HandlerResult(outcome, detail)
