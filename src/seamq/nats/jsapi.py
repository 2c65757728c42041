"""JetStream API calls nats-py has no method for (priority groups: partition consumers, pins)."""

from __future__ import annotations

import json

from nats.aio.client import Client

from seamq.model import ErrorCode, SeamqError


async def call(nc: Client, subject: str, body: dict | None = None, *, timeout: float = 5) -> dict | None:
    """`$JS.API.{subject}` with a JSON body: the reply, None when the server says not found,
    SeamqError for any other refusal."""
    reply = json.loads((await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(),
                                         timeout=timeout)).data)
    error = reply.get("error")
    if error and error.get("code") == 404:
        return None
    if error:
        raise SeamqError(ErrorCode.BROKER_UNAVAILABLE if error.get("code", 0) >= 500 else ErrorCode.INVALID_TOPOLOGY,
                         f"JetStream refused {' '.join(subject.split('.')[:2]).lower()}: {error.get('description')}")
    return reply
