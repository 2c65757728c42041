"""The consumer side of SDS-047 §12: POST /handle with the REQ-058 envelope.

Status codes map to outcomes: 200 ok, 409 already processed, 422 poison,
423 busy (the service is handling this message in another call: seamq.http.handled;
it comes back later, and that is no attempt of the handler's);
5xx, timeouts, connection errors and any other status mean "try again"
(a 401 from a wrong shared secret must not dead-letter good messages).
A 422 whose body says `"reason": "schema_mismatch"` (seamq.http.server, for
a typed handler) is dead-lettered under that reason.

The calls go through seamq.http.wire, a lean HTTP/1.1 client, not through
httpx (the stack's first choice: 738 req/s with one connection, 265 with 32,
client CPU-bound on the 2-core box) nor aiohttp (2,601 and 4,873 req/s, but
its request path cost more CPU per message than the rest of the consumer):
docs/benchmarks.md, section 4.
"""

from __future__ import annotations

import json

from seamq.envelope import Envelope, HandlerResult, Outcome, Reason
from seamq.http.signing import sign
from seamq.http.wire import HandlerClient, Target, Unreachable
from seamq.model import Header, describe
from seamq.observability import log

_OUTCOMES = {200: Outcome.OK, 201: Outcome.OK, 202: Outcome.OK, 204: Outcome.OK,
             409: Outcome.ALREADY_PROCESSED, 422: Outcome.POISON, 423: Outcome.BUSY}
_QUIET = {status: HandlerResult(outcome) for status, outcome in _OUTCOMES.items()  # the OK answers:
          if outcome == Outcome.OK}  # one shared result each, their bodies unread


def http_client(max_connections: int = 64) -> HandlerClient:
    """One pooled keep-alive client per consumer process (create it inside the event loop)."""
    return HandlerClient(limit=max_connections)


class Refusals:
    """Handler services that refuse the consumer's signature (401): the shared secret is wrong or
    missing on one side, so every message is retried and none is handled. Retrying is right (the
    message is good), and /readyz says so until a call is accepted again; the first refusal is
    logged as an error."""

    def __init__(self) -> None:
        self.refusing: dict[str, str] = {}  # url -> what it answered

    def saw(self, url: str, status: int, text: str) -> None:
        if status != 401:
            self.refusing.pop(url, None)
        elif url not in self.refusing:
            self.refusing[url] = text[:200]
            log.error("handler_refuses_signature", url=url, answer=text[:200],
                      fix="the consumer's SEAMQ_CONSUMER__HANDLER_SECRET and the service's secret must be the same")

    async def check(self) -> None:
        if self.refusing:
            raise RuntimeError(f"{', '.join(self.refusing)} refuses the signature (401): set the same handler "
                               "secret on both sides")


class HttpHandler:
    transactional = False

    def __init__(self, url: str, *, client: HandlerClient, secret: str | None = None,
                 timeout: float = 10.0, refusals: Refusals | None = None, consumer: str | None = None) -> None:
        self.url, self.client, self.secret, self.timeout = url, client, secret, timeout
        self.refusals, self.consumer = refusals, consumer
        self._target = Target(url)  # parsed once

    def __repr__(self) -> str:
        return f"HttpHandler({self.url})"

    async def __call__(self, envelope: Envelope, conn=None, traceparent: str | None = None) -> HandlerResult:
        body, headers = request_of(envelope, secret=self.secret, traceparent=traceparent, consumer=self.consumer)
        try:
            status, answer = await self.client.post(self._target, body, headers, self.timeout)
        except TimeoutError:
            return HandlerResult.timed_out(self.timeout)
        except (Unreachable, OSError) as exc:
            return HandlerResult(Outcome.RETRY, f"handler unreachable: {describe(exc)}")
        if status in _QUIET:  # the common answer: nothing in its body is read
            if self.refusals is not None and self.refusals.refusing:
                self.refusals.saw(self.url, status, "")
            return _QUIET[status]
        text = answer.decode(errors="replace")
        if self.refusals is not None:
            self.refusals.saw(self.url, status, text)
        return result_of(status, text)


def request_of(envelope: Envelope, *, secret: str | None = None, traceparent: str | None = None,
               consumer: str | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the POST for this envelope (seamq.testing sends the same). The
    consumer's name keys the service's record of what it handled (seamq.http.handled)."""
    body = envelope.body()
    headers = {"content-type": "application/json"}
    if consumer:
        headers[Header.CONSUMER] = consumer
    if secret:
        headers[Header.SIGNATURE] = sign(secret, body)
    if traceparent:
        headers["traceparent"] = traceparent
    return body, headers


def result_of(status: int, text: str) -> HandlerResult:
    """A handler service's answer as an outcome: the one mapping, for the consumer and seamq.testing."""
    outcome = _OUTCOMES.get(status, Outcome.RETRY)
    detail = None if outcome == Outcome.OK else f"HTTP {status}: {text[:500]}"
    return HandlerResult(outcome, detail, reason=_reason(text) if status == 422 else None)


def _reason(text: str) -> Reason | None:
    """The one reason a handler service may give for its 422 (seamq.http.server, typed handlers)."""
    try:
        said = json.loads(text).get("reason")
    except (ValueError, AttributeError, RecursionError):
        return None
    return Reason.SCHEMA_MISMATCH if said == Reason.SCHEMA_MISMATCH.value else None
