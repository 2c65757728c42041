-- A row the relay can never publish as it is (its context has no stream, its subject is invalid,
-- it is larger than the server takes) is parked, not retried forever: the relay logged the same
-- error on every claim, the context's backlog gauge never fell, and no command could see or drop
-- the row. A parked row keeps next_attempt_at = 'infinity', so the claim never takes it and its
-- aggregate's later rows wait behind it, as behind any row backing off (order is kept); it is
-- counted apart (seamq_outbox_parked) and listed, moved, retried or dropped with `seamq outbox`.
ALTER TABLE outbox_events ADD COLUMN parked_reason TEXT;          -- seamq: why the relay gave up
ALTER TABLE outbox_events ADD COLUMN parked_at TIMESTAMPTZ;
CREATE INDEX idx_outbox_parked ON outbox_events (parked_at) WHERE parked_reason IS NOT NULL;
