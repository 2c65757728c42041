"""faststream-outbox's relay to NATS JetStream, as its relay tutorial writes it: a NATS publisher
stacked on an outbox subscriber. The row's headers (Nats-Msg-Id among them) are carried onto the
JetStream publish (`propagate_inbound_headers`), which waits for JetStream's ack; the row is
deleted only after that. Run: python -m bench.peers.faststream_outbox_relay (PEER_DSN, PEER_NATS)."""

import asyncio
import os
import signal

from faststream.nats import JStream, NatsBroker
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from faststream_outbox import OutboxBroker, make_outbox_table

QUEUE = "events"
SUBJECT = "sea.event.order_placed.v1"
metadata = MetaData()
table = make_outbox_table(metadata, table_name="outbox")


def brokers(dsn: str, nats_url: str, workers: int) -> tuple[OutboxBroker, NatsBroker]:
    # Its subscriber holds a connection per worker and one to fetch: the pool is sized to that, as its error says.
    engine = create_async_engine(dsn, pool_size=workers + 2)
    outbox = OutboxBroker(engine, outbox_table=table, logger=None)  # no log line per row (seamq runs at warning)
    bus = NatsBroker(nats_url, logger=None)
    publisher = bus.publisher(SUBJECT, stream=JStream("SEA_EVENTS", declare=False))

    @publisher
    @outbox.subscriber(QUEUE, max_workers=workers, fetch_batch_size=max(10, workers * 4),
                       min_fetch_interval=0.05, max_fetch_interval=1.0, propagate_inbound_headers=True)
    async def relay(body: dict) -> dict:
        return body

    return outbox, bus


async def main() -> None:
    outbox, bus = brokers(os.environ["PEER_DSN"], os.environ["PEER_NATS"], int(os.environ.get("PEER_WORKERS", "16")))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await bus.start()
    await outbox.start()
    await stop.wait()
    await outbox.stop()
    await bus.stop()


if __name__ == "__main__":
    asyncio.run(main())
