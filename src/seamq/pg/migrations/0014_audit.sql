-- The online audit (seamq audit, issue 47): where each of its walks has got to, and what it found.
-- A walk is one context's outbox rows against its stream, one context's stream against its outbox, or
-- one consumer's stream messages below its ack floor against its inbox. Its position is a time (rows
-- by published_at) or a stream sequence.
CREATE TABLE audit_cursors (
  walk       TEXT PRIMARY KEY,        -- 'published:<context>', 'stream:<context>', 'inbox:<consumer>'
  at         TIMESTAMPTZ,             -- published rows: audited up to this published_at ...
  id         UUID,                    -- ... and this id among those published at that instant
  seq        BIGINT,                  -- stream walks: audited up to this stream sequence
  updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- One row per thing found missing, kept after it is repaired: a person reads them (console, CLI).
CREATE TABLE audit_findings (
  kind        TEXT NOT NULL,          -- not_in_stream | outbox_row_gone | not_in_inbox
  scope       TEXT NOT NULL,          -- the context (stream walks) or the consumer (inbox walk)
  message_id  UUID NOT NULL,
  stream      TEXT NOT NULL,
  stream_seq  BIGINT,                 -- where it was (not_in_stream: where the outbox said it was)
  found_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  repaired_at TIMESTAMPTZ,            -- published again (not_in_stream only)
  repair_seq  BIGINT,                 -- where the copy went
  detail      TEXT,
  PRIMARY KEY (kind, scope, message_id)
);
CREATE INDEX idx_audit_findings_found ON audit_findings (found_at);
