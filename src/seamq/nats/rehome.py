"""A publisher that leaves a server cut off from its cluster.

A server split from its peers still answers its clients' pings, so a client stays on it; a relay
connected to a stream leader split off (a minority of one) had every publish time out until the
split healed: 20 s and more (docs/operations.md, "A NATS cluster"). When a publish fails for the
broker's sake while the connection is up, this asks the server for JetStream's account info, which
a server cut off from the cluster's JetStream cannot give; if it cannot, the client moves to
another server (nats-py's `force_reconnect`, the next server chosen by seamq.nats.connect.Rotation).
"""

from __future__ import annotations

import json
import time

from nats.aio.client import Client

from seamq.model import describe
from seamq.observability import log
from seamq.ports import JetStreamPublisher, OutMessage, PubResult

PROBE_TIMEOUT = 2.0  # seconds JetStream's account info may take from a server still in its cluster
PROBE_EVERY = 2.0  # seconds at least between two probes


class Rehoming:
    """`publisher`, and a move to another server when the one it is on is cut off from the cluster."""

    def __init__(self, publisher: JetStreamPublisher, nc: Client) -> None:
        self.publisher, self.nc = publisher, nc
        self._probed_at = 0.0

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]:
        results = await self.publisher.publish_many(messages)
        if any(r.transport for r in results) and self.nc.is_connected:
            await self._probe()
        return results

    async def _probe(self) -> None:
        now = time.monotonic()
        if now - self._probed_at < PROBE_EVERY:
            return
        self._probed_at = now
        why = await self.cut_off()
        if why and self.nc.is_connected:
            url = self.nc.connected_url
            log.warning("nats_server_cut_off", server=url.netloc if url else "?", error=why,
                        action="moving to another server")
            await self.nc.force_reconnect()

    async def cut_off(self) -> str | None:
        """Why the server this connection is on cannot serve JetStream now (None: it can)."""
        try:
            answer = json.loads((await self.nc.request("$JS.API.INFO", b"", timeout=PROBE_TIMEOUT)).data)
        except Exception as exc:  # no answer, or no responders: it is not in touch with JetStream
            return describe(exc)
        error = answer.get("error") if isinstance(answer, dict) else None
        return f"{error.get('description')} (err_code {error.get('err_code')})" if error else None

    async def close(self) -> None:
        await self.publisher.close()
