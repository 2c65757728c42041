-- SDS-047 §9 outbox and inbox, plus what the relay, consumer, DLQ replay and
-- KPIs need. Columns beyond §9 are marked "seamq:" with the reason.

CREATE TABLE outbox_events (
  id UUID PRIMARY KEY,
  aggregate_type TEXT NOT NULL,
  aggregate_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  event_version INT NOT NULL DEFAULT 1,
  payload JSONB NOT NULL,
  occurred_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
  correlation_id UUID,
  causation_id UUID,
  published_at TIMESTAMPTZ,
  publish_attempts INT NOT NULL DEFAULT 0,
  publish_error TEXT,

  -- seamq: the owning context names the stream; one database may serve several.
  context TEXT NOT NULL,
  -- seamq: write order, so events of one aggregate publish in the order written.
  seq BIGINT GENERATED ALWAYS AS IDENTITY,
  -- seamq: aggregates hash into 128 buckets; a relay owns a bucket while it
  -- publishes it, which is what keeps per-aggregate order with many relays.
  bucket SMALLINT GENERATED ALWAYS AS
    ((hashtextextended(aggregate_type || '/' || aggregate_id, 0) & 127)::smallint) STORED,
  created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),  -- seamq: relay lag
  next_attempt_at TIMESTAMPTZ,   -- seamq: per-row backoff after a failed publish
  stream_seq BIGINT,             -- seamq: where JetStream stored it, for reconcile
  traceparent TEXT,              -- seamq: W3C trace context of the writer

  CONSTRAINT chk_occurred_not_future CHECK (occurred_at <= NOW() + INTERVAL '1 minute'),
  CONSTRAINT chk_event_version CHECK (event_version >= 1),
  CONSTRAINT chk_event_type CHECK (event_type <> '')
);

CREATE INDEX idx_outbox_unpublished ON outbox_events (occurred_at)
  WHERE published_at IS NULL;
CREATE INDEX idx_outbox_correlation ON outbox_events (correlation_id);
CREATE INDEX idx_outbox_pending_seq ON outbox_events (seq)
  WHERE published_at IS NULL;
CREATE INDEX idx_outbox_backoff ON outbox_events (aggregate_type, aggregate_id, seq)
  WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE INDEX idx_outbox_published_at ON outbox_events (published_at)
  WHERE published_at IS NOT NULL;

-- Wake relays right after commit; polling stays as the fallback.
CREATE FUNCTION seamq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('seamq_outbox', '');
  RETURN NULL;
END $$;
CREATE TRIGGER trg_outbox_notify AFTER INSERT ON outbox_events
  FOR EACH STATEMENT EXECUTE FUNCTION seamq_outbox_notify();

CREATE TABLE inbox_messages (
  message_id UUID NOT NULL,
  subject TEXT NOT NULL,
  received_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
  processed_at TIMESTAMPTZ,
  attempts INT NOT NULL DEFAULT 0,
  last_error TEXT,

  -- seamq: the durable consumer that received it. Part of the key, so two
  -- consumers of one message in a shared database do not skip each other.
  consumer TEXT NOT NULL DEFAULT '',
  -- seamq: received | processed | dead_lettered | exhausted
  status TEXT NOT NULL DEFAULT 'received',
  event_type TEXT,               -- seamq: KPIs per event type
  event_version INT,
  occurred_at TIMESTAMPTZ,       -- seamq: end-to-end latency
  duplicates INT NOT NULL DEFAULT 0,   -- seamq: duplicate deliveries seen (KPI)
  dlq_metadata JSONB,            -- REQ-059: replay_attempts, next_replay_at, reason

  PRIMARY KEY (consumer, message_id),
  CONSTRAINT chk_processed_after_received
    CHECK (processed_at IS NULL OR processed_at >= received_at),   -- POL-047-004
  CONSTRAINT chk_inbox_status
    CHECK (status IN ('received', 'processed', 'dead_lettered', 'exhausted'))
);

CREATE INDEX idx_inbox_unprocessed ON inbox_messages (received_at)
  WHERE processed_at IS NULL;
CREATE INDEX idx_inbox_dead_lettered ON inbox_messages (consumer, received_at)
  WHERE status IN ('dead_lettered', 'exhausted');
CREATE INDEX idx_inbox_processed_at ON inbox_messages (processed_at)
  WHERE processed_at IS NOT NULL;
