"""An Open Job Spec (OJS 1.0) job server on NATS JetStream + KV (ADR-013, as amended by ADR-013a in
docs/jobs.md): `model` (no I/O), `store` (NATS), `engine` (operations and clocks), `api` (HTTP),
`serve` (wiring, `seamq jobs serve`)."""
from seamq.jobs.durable import Checkpoint
from seamq.jobs.handlers import JobHandlers, RateLimited
from seamq.jobs.transactional import enqueue, enqueue_async

__all__ = ["Checkpoint", "JobHandlers", "RateLimited", "enqueue", "enqueue_async"]
