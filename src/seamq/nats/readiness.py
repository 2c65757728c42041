"""What the broker holds, asked of the server: readiness checks (seamq.health.Check: connected,
the streams and consumers a worker needs present), whether a stream is there for a command, and a
durable consumer's numbers for the console."""

from __future__ import annotations

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from seamq.health import Check


def connected(nc: Client) -> Check:
    async def check() -> None:
        if not nc.is_connected:
            raise ConnectionError("not connected to NATS (reconnecting)")
    return check


async def has_stream(nc: Client, stream: str) -> bool:
    try:
        await nc.jetstream().stream_info(stream)
    except NotFoundError:
        return False
    return True


async def durable_numbers(nc: Client, stream: str, durable: str, *, timeout: float) -> dict[str, int]:
    """A durable consumer's numbers as JetStream has them now (the console's overview)."""
    info = await nc.jetstream().consumer_info(stream, durable, timeout=timeout)
    return {"pending": info.num_pending or 0, "ack_pending": info.num_ack_pending or 0,
            "redelivered": info.num_redelivered or 0, "waiting": info.num_waiting or 0}


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
        limited = []
        for stream, durable in consumers:
            try:
                info = await js.consumer_info(stream, durable)
            except NotFoundError:
                missing.append(f"consumer {durable}")
                continue
            if (info.config.max_deliver or -1) > 0:  # provisioned before 0.3: holds could use it up in silence
                limited.append(f"consumer {durable} stops delivering after {info.config.max_deliver} deliveries")
        if missing or limited:
            problems = [f"{', '.join(missing)} missing"] if missing else []
            raise LookupError("; ".join(problems + limited) + ": run `seamq provision`")
    return check
