"""The DLQ replay worker (REQ-059): dead letters go back to their original subject.

Each replayable dead letter (by reason; malformed input is not) is scheduled
with an exponential delay and jitter, re-published when due, and counted in
`dlq_metadata.replay_attempts`; at the cap it is marked `exhausted` and stays
in the DLQ for a person (`seamq dlq ...`).

A replay must really be processed again, so it gets a Nats-Msg-Id of its own
(`replay:{id}:{n}`: JetStream's duplicate window would swallow the original
id), while `Seamq-Message-Id` keeps the inbox key, and `Seamq-Replay-Attempt`
tells the consumer that the dead-lettered inbox row is to be processed, not
skipped.
"""

from __future__ import annotations

import asyncio
import json

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from seamq.envelope import REPLAY_ATTEMPT, Original, original_message, republish_headers
from seamq.model import ReplayPolicy
from seamq.observability import log
from seamq.pg import dlq_repo
from seamq.ports import JetStreamPublisher, OutMessage
from seamq.topology import Topology


class Replayer:
    def __init__(self, pool, js: JetStreamContext, publisher: JetStreamPublisher, topology: Topology,
                 policy: ReplayPolicy | None = None, *, nak_max: float = 60.0, interval: float = 1.0) -> None:
        self.pool, self.js, self.publisher, self.topology = pool, js, publisher, topology
        self.policy = policy or ReplayPolicy()
        self.interval = interval
        # A replay that never comes back (lost, or its consumer is down) is
        # replayed again after the longest time its consumer could take with it.
        self.watchdog = self.policy.max_delay + max(
            (c.max_deliver * max(c.ack_wait, nak_max) for c in topology.consumers.values()), default=600)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:  # database or broker away: try again next round
                log.warning("replay_round_failed", error=f"{type(exc).__name__}: {exc}")
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass

    async def run_once(self) -> int:
        async with self.pool.connection() as conn, conn.transaction():
            await dlq_repo.schedule(conn, self.policy)
        async with self.pool.connection() as conn, conn.transaction():
            rows = await dlq_repo.due(conn)
            return await self.replay(conn, rows)

    async def replay(self, conn, rows: list[dict]) -> int:
        """Re-publish each row's original message now; returns how many went out."""
        ready = []
        for row in rows:
            message = await self._original(row)
            if message is not None:
                ready.append((row, message))
        results = await self.publisher.publish_many([m for _, m in ready])
        replayed = 0
        for (row, message), result in zip(ready, results):
            if not result.ok:
                log.warning("replay_publish_failed", message_id=str(row["message_id"]), error=result.error)
                continue
            await dlq_repo.mark_replayed(conn, row["consumer"], row["message_id"], self.watchdog)
            replayed += 1
            log.info("message_replayed", consumer=row["consumer"], message_id=str(row["message_id"]),
                     subject=message.subject, attempt=message.headers[REPLAY_ATTEMPT])
        return replayed

    async def _original(self, row: dict) -> OutMessage | None:
        meta = row["dlq_metadata"] or {}
        spec = self.topology.consumers.get(row["consumer"])
        if spec is None or meta.get("dlq_seq") is None:
            log.warning("replay_skipped", message_id=str(row["message_id"]), why="unknown consumer or DLQ copy")
            return None
        try:
            raw = await self.js.get_msg(self.topology.contexts[spec.target].dlq.name, int(meta["dlq_seq"]))
        except NotFoundError:
            log.warning("replay_skipped", message_id=str(row["message_id"]), why="DLQ copy expired or purged")
            return None
        original = original_message(json.loads(raw.data))
        if not original.complete:  # too big to travel inside the dead letter: read it where it is
            try:
                original = await read_original(self.js, original)
            except NotFoundError:
                log.warning("replay_skipped", message_id=str(row["message_id"]),
                            why=f"original gone from stream {original.stream} (seq {original.seq})")
                return None
        attempt = int(meta.get("replay_attempts") or 0) + 1
        headers = republish_headers(original.headers, msg_id=f"replay:{row['message_id']}:{attempt}",
                                    message_id=str(row["message_id"]), replay_attempt=attempt)
        return OutMessage(original.subject, original.data, headers)


async def read_original(js: JetStreamContext, original: Original) -> Original:
    """Fill in what a dead letter left in the original's stream (raises NotFoundError when it is gone)."""
    if original.stream is None or original.seq is None:
        raise NotFoundError
    raw = await js.get_msg(original.stream, int(original.seq))
    return Original(original.subject, original.headers if original.headers is not None else dict(raw.headers or {}),
                    raw.data or b"", original.stream, original.seq)
