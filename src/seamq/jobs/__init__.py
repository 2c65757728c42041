"""An Open Job Spec (OJS 1.0) job server on NATS JetStream + KV (ADR-013, as amended by ADR-013a in
docs/jobs.md): `model` (no I/O), `store` (NATS), `engine` (operations and clocks), `api` (HTTP),
`serve` (wiring, `seamq jobs serve`)."""
from seamq.jobs.handlers import JobHandlers

__all__ = ["JobHandlers"]
