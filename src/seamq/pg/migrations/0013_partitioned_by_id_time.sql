-- The outbox, the inbox and the attempts table partitioned by time (issue 45): retention drops a
-- whole partition, in constant time, instead of deleting rows as fast as a service writes them.
--
-- The key is `part`, the time a row's id tells (seamq_id_time), not the time a row was written: a
-- partition must hold every copy of a message, and only the id is the same on every copy. `part`
-- is a function of the id (a CHECK on every partition seamq makes), so the key (id, part) is as
-- unique as the id itself. Ranges on the id alone cannot work: an id that is no UUIDv7 (a
-- producer's own UUIDv4, a foreign publisher's) begins with random bits, not a time.
--
-- Rows already here stay where they are: the table becomes the partition `*_legacy`, for every id
-- dated before the start (T) and every id that is no UUIDv7, and is purged by DELETE as before. T
-- is 2020 on an empty install (every UUIDv7 has its day), else the start of the day after tomorrow
-- (UTC), so producers of the version before, which write no `part`, keep working until T while
-- they are upgraded.
-- Dated partitions, made ahead, and a default partition for what falls outside them (a late
-- copy of a message whose day was dropped, an id dated too far ahead, the unfinished rows of a
-- dropped day) are made by seamq.pg.partitions.

CREATE TABLE seamq_partitioning (
  name TEXT PRIMARY KEY,                               -- the partitioned table
  id_column TEXT NOT NULL,                             -- the id its partition key is the time of
  starts TIMESTAMPTZ NOT NULL,                         -- T: ids dated before it are legacy
  every INTERVAL NOT NULL DEFAULT interval '1 day',    -- one partition's span
  ahead INT NOT NULL DEFAULT 3                         -- partitions kept made ahead of now
);

DO $migration$
DECLARE
  starts timestamptz := CASE
    WHEN NOT EXISTS (SELECT 1 FROM outbox_events) AND NOT EXISTS (SELECT 1 FROM inbox_messages)
    THEN timestamptz '2020-01-01 00:00:00+00'
    ELSE date_trunc('day', now(), 'UTC') + interval '2 days' END;
  item record;
  index record;
BEGIN
  -- PL/pgSQL, not SQL: a SQL function that cannot be inlined is planned again in every statement
  -- that calls it, and each insert calls it twice (its value, its partition's CHECK): 67 us an
  -- insert against 13 (docs/benchmarks.md, 1c).
  EXECUTE format($f$
    CREATE FUNCTION seamq_id_time(id uuid) RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
    DECLARE
      b bytea := uuid_send(id);
      t timestamptz;
    BEGIN
      IF get_byte(b, 6) >> 4 <> 7 OR get_byte(b, 8) >> 6 <> 2 THEN  -- no UUIDv7
        RETURN timestamptz 'epoch';
      END IF;
      t := timestamptz 'epoch' + ('x' || encode(substr(b, 1, 6), 'hex'))::bit(48)::bigint * interval '1 ms';
      RETURN CASE WHEN t >= %1$L THEN t ELSE timestamptz 'epoch' END;
    END
    $body$ $f$, starts);

  ALTER TABLE inbox_attempts DROP CONSTRAINT inbox_attempts_consumer_message_id_fkey;
  -- On an install with rows, `seamq db upgrade` has done these already, online (seamq.pg.online):
  -- then this transaction only renames, attaches and checks names, in milliseconds.
  ALTER TABLE inbox_attempts ADD COLUMN IF NOT EXISTS part timestamptz NOT NULL DEFAULT 'epoch';
  ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS part timestamptz NOT NULL DEFAULT 'epoch';
  ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS part timestamptz NOT NULL DEFAULT 'epoch';

  FOR item IN SELECT * FROM (VALUES
      ('outbox_events', 'id', 'PRIMARY KEY (id, part)', 'outbox_events_pkey'),
      ('inbox_messages', 'message_id', 'PRIMARY KEY (consumer, message_id, part)', 'inbox_messages_pkey'),
      ('inbox_attempts', 'message_id', NULL, NULL)) AS t(name, id, key, old_key)
  LOOP
    IF item.key IS NOT NULL THEN
      EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', item.name, item.old_key);
      IF to_regclass(item.name || '_key_by_time') IS NOT NULL THEN  -- built beforehand, concurrently
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I',
                       item.name, item.old_key, item.name || '_key_by_time');
      END IF;
    END IF;
    -- Every legacy row is dated 'epoch': proven by a validated constraint, the attach reads no row.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = item.name || '_legacy_is_epoch') THEN
      EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (part = %L)', item.name, item.name || '_legacy_is_epoch',
                     'epoch');
    END IF;
    FOR index IN SELECT indexname FROM pg_indexes WHERE tablename = item.name AND schemaname = current_schema() LOOP
      EXECUTE format('ALTER INDEX %1$I RENAME TO %2$I', index.indexname, index.indexname || '_legacy');
    END LOOP;
    EXECUTE format('ALTER TABLE %1$I RENAME TO %2$I', item.name, item.name || '_legacy');
    EXECUTE format('CREATE TABLE %1$I (LIKE %2$I INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY '
                   'INCLUDING CONSTRAINTS INCLUDING STATISTICS) PARTITION BY RANGE (part)', item.name, item.name || '_legacy');
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', item.name, item.name || '_legacy_is_epoch');  -- legacy's alone
    IF item.key IS NOT NULL THEN
      EXECUTE format('ALTER TABLE %I ADD %s', item.name, item.key);
    END IF;
    -- The legacy rows were dated 'epoch' (1970) by the ADD COLUMN (no rewrite); only new rows are checked.
    EXECUTE format('ALTER TABLE %1$I ADD CONSTRAINT %2$I CHECK (part = seamq_id_time(%3$I)) NOT VALID',
                   item.name || '_legacy', item.name || '_part_is_id_time', item.id);
    EXECUTE format('ALTER TABLE %1$I ATTACH PARTITION %2$I FOR VALUES FROM (MINVALUE) TO (%3$L)',
                   item.name, item.name || '_legacy', starts);
    -- Until the first dated partitions are made (seamq.pg.partitions, by `seamq db upgrade` and
    -- by every worker), new rows wait here; making a partition moves them into it.
    EXECUTE format('CREATE TABLE %1$I PARTITION OF %2$I DEFAULT', item.name || '_default', item.name);
    EXECUTE format('ALTER TABLE %1$I ADD CONSTRAINT %2$I CHECK (part = seamq_id_time(%3$I))',
                   item.name || '_default', item.name || '_default_part_is_id_time', item.id);
    INSERT INTO seamq_partitioning (name, id_column, starts) VALUES (item.name, item.id, starts);
  END LOOP;

  -- The write order continues across the tables' change; the legacy table's own sequence goes.
  EXECUTE format('SELECT setval(%L, last_value, is_called) FROM %s',
                 pg_get_serial_sequence('outbox_events', 'seq'), pg_get_serial_sequence('outbox_events_legacy', 'seq'));
  ALTER TABLE outbox_events_legacy ALTER COLUMN seq DROP IDENTITY;
END
$migration$;

-- Indexes of the parents reach every partition, the legacy one's included (attached, as they match).
CREATE INDEX idx_inbox_attempts_message ON inbox_attempts (consumer, message_id, failed_at);
CREATE INDEX idx_outbox_backoff ON outbox_events (aggregate_type, aggregate_id, seq)
  WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE INDEX idx_outbox_correlation ON outbox_events (correlation_id);
CREATE INDEX idx_outbox_held ON outbox_events (deliver_at) WHERE held;
CREATE INDEX idx_outbox_occurred_brin ON outbox_events USING brin (occurred_at)
  WITH (pages_per_range = 32, autosummarize = on);
CREATE INDEX idx_outbox_parked ON outbox_events (parked_at) WHERE parked_reason IS NOT NULL;
CREATE INDEX idx_outbox_pending_seq ON outbox_events (seq) WHERE published_at IS NULL AND NOT held;
CREATE INDEX idx_outbox_published_at ON outbox_events (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX idx_inbox_unprocessed ON inbox_messages (received_at) WHERE processed_at IS NULL;
CREATE INDEX idx_inbox_dead_lettered ON inbox_messages (consumer, received_at)
  WHERE status IN ('dead_lettered', 'exhausted');
CREATE INDEX idx_inbox_processed_at ON inbox_messages (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX idx_inbox_occurred_brin ON inbox_messages USING brin (occurred_at)
  WITH (pages_per_range = 32, autosummarize = on);
CREATE INDEX idx_inbox_ever_dead_lettered ON inbox_messages (consumer) WHERE dlq_metadata IS NOT NULL;
-- A day is dropped only once nothing in it was received within the retention (late copies land in it).
CREATE INDEX idx_inbox_received_brin ON inbox_messages USING brin (received_at)
  WITH (pages_per_range = 32, autosummarize = on);

CREATE TRIGGER trg_outbox_notify AFTER INSERT ON outbox_events
  FOR EACH STATEMENT EXECUTE FUNCTION seamq_outbox_notify();
DROP TRIGGER trg_outbox_notify ON outbox_events_legacy;
