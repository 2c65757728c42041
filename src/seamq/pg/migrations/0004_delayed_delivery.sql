-- Delayed delivery (issue 15): outbox.add(..., deliver_at=...) publishes an event no earlier than
-- deliver_at. The relay holds the row; JetStream message schedules were measured firing 50-250 ms
-- late (docs/jobs.md), and the row is already the durable record of the event.
--
-- `held` is true while a row waits for its time; the relay clears it once due (query claim_buckets)
-- and the row then publishes like any other. Held rows stay out of the pending-seq index, so any
-- number of them costs the claim nothing: it reads only the head of that index.
ALTER TABLE outbox_events ADD COLUMN deliver_at TIMESTAMPTZ;        -- seamq: not published before
ALTER TABLE outbox_events ADD COLUMN held BOOLEAN NOT NULL DEFAULT false;  -- seamq: waiting for deliver_at

DROP INDEX idx_outbox_pending_seq;
CREATE INDEX idx_outbox_pending_seq ON outbox_events (seq)
  WHERE published_at IS NULL AND NOT held;
CREATE INDEX idx_outbox_held ON outbox_events (deliver_at)
  WHERE held;
