"""Readiness checks on the broker side (seamq.health.Check): connected, and the
streams and consumers a worker needs present, asked of the server when a probe asks."""

from __future__ import annotations

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from seamq.health import Check


def connected(nc: Client) -> Check:
    async def check() -> None:
        if not nc.is_connected:
            raise ConnectionError("not connected to NATS (reconnecting)")
    return check


def provisioned(nc: Client, streams: list[str], consumers: list[tuple[str, str]] = ()) -> Check:
    """`consumers`: (stream, durable) pairs."""
    js = nc.jetstream()

    async def check() -> None:
        missing = []
        for stream in streams:
            try:
                await js.stream_info(stream)
            except NotFoundError:
                missing.append(f"stream {stream}")
        for stream, durable in consumers:
            try:
                await js.consumer_info(stream, durable)
            except NotFoundError:
                missing.append(f"consumer {durable}")
        if missing:
            raise LookupError(f"{', '.join(missing)} missing: run `seamq provision`")
    return check
