-- Every failed attempt of a handler, kept after a later attempt succeeds: what failed, when, and
-- why. The inbox row's `attempts` counts the handler's attempts in the current round (a DLQ
-- replay starts a new one); a delivery that only held a message behind its aggregate, or one
-- that ended with the consumer, is no attempt (docs/operations.md, "What max_deliver counts").
-- Written only when an attempt fails, never on the fast path; purged with its inbox row.
CREATE TABLE inbox_attempts (
  consumer TEXT NOT NULL,
  message_id UUID NOT NULL,
  attempt INT NOT NULL,
  failed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  error TEXT NOT NULL,
  FOREIGN KEY (consumer, message_id) REFERENCES inbox_messages (consumer, message_id) ON DELETE CASCADE
);
CREATE INDEX idx_inbox_attempts_message ON inbox_attempts (consumer, message_id, failed_at);
