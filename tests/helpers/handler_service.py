"""A real FastAPI handler service (uvicorn on a free port) whose answers a test scripts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict

import uvicorn

from seamq.embedded import free_port
from seamq.envelope import Envelope, Poison
from seamq.http.server import handler_app


class ScriptedHandler:
    """Per aggregate_id, a list of answers used in turn: 'ok', 'fail', 'poison', 'sleep:S'. Then 'ok'."""

    def __init__(self) -> None:
        self.script: dict[str, list[str]] = defaultdict(list)
        self.calls: Counter = Counter()  # message_id -> calls
        self.handled: Counter = Counter()  # message_id -> successful calls
        self.order: list[tuple[str, int]] = []  # (aggregate_id, n) in handling order
        self.deliveries: dict[str, list[int]] = defaultdict(list)  # message_id -> delivery_attempt per call

    async def __call__(self, envelope: Envelope) -> None:
        key = str(envelope.message_id)
        self.calls[key] += 1
        self.deliveries[key].append(envelope.delivery_attempt)
        answers = self.script[envelope.aggregate_id]
        answer = answers.pop(0) if answers else "ok"
        if answer.startswith("sleep:"):
            await asyncio.sleep(float(answer.split(":")[1]))
        elif answer == "fail":
            raise RuntimeError("scripted transient failure")
        elif answer == "poison":
            raise Poison("scripted poison: total must be positive")
        self.handled[key] += 1
        self.order.append((envelope.aggregate_id, envelope.payload.get("n", 0)))


class HandlerService:
    """`handler`: the service's function (handler_app's argument); a ScriptedHandler by default."""

    def __init__(self, secret: str | None = "test-secret", handler=None) -> None:
        self.handler = handler or ScriptedHandler()
        self.secret = secret
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/handle"
        config = uvicorn.Config(handler_app(self.handler, secret=secret), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "HandlerService":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("handler service did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(5)
