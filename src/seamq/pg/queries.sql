-- Every SQL statement seamq runs, by name. Loaded by seamq.pg.sql.
-- Parameters use psycopg's %(name)s style; casts use CAST(...) so the same
-- text also works through SQLAlchemy's text() and asyncpg.
-- A statement by ids joins them row by row with the day each tells (`part = seamq_id_time(id)`,
-- migration 0013): each id reads its own day only, pruned as the statement runs. A statement the
-- relay sends together with others ends without a comment (the `;` after it must not be one).

-- name: insert_outbox
-- A row due later than now is held (migration 0004): the relay publishes it once due.
INSERT INTO outbox_events
  (id, context, aggregate_type, aggregate_id, event_type, event_version, payload,
   occurred_at, correlation_id, causation_id, traceparent, deliver_at, held, part)
VALUES
  (%(id)s, %(context)s, %(aggregate_type)s, %(aggregate_id)s, %(event_type)s, %(event_version)s,
   CAST(%(payload)s AS jsonb), %(occurred_at)s, %(correlation_id)s, %(causation_id)s, %(traceparent)s,
   CAST(%(deliver_at)s AS timestamptz), coalesce(CAST(%(deliver_at)s AS timestamptz) > now(), false),
   seamq_id_time(CAST(%(id)s AS uuid)))

-- name: wake_register
-- A relay about to sleep asks producers to NOTIFY (migration 0002): it takes
-- lock (7105, 0) unless a producer that skipped its NOTIFY is still open.
-- 'covered': another relay holds it already, so producers notify anyway.
SELECT CASE WHEN pg_try_advisory_lock(7105, 0) THEN 'registered'
            WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 7105 AND objid = 0
                           AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted) THEN 'covered'
            ELSE 'uncovered' END

-- name: wake_unregister
SELECT pg_advisory_unlock(7105, 0)

-- name: claim_buckets
-- Claim buckets, not rows: a relay takes an advisory lock (held to commit) on
-- each bucket it serves, skipping buckets another relay holds. All events of
-- one aggregate share a bucket, so only one relay publishes an aggregate at a
-- time, in seq order. Row-level SKIP LOCKED alone would let two relays publish
-- one aggregate's events out of order.
--
-- The scan looks past rows that are backing off and their aggregates' later
-- rows: otherwise enough stuck rows (say, a context with no stream) fill the
-- scan window and starve every healthy aggregate behind them.
WITH blocked AS MATERIALIZED (
  SELECT aggregate_type, aggregate_id, min(seq) AS from_seq FROM outbox_events
  WHERE published_at IS NULL AND next_attempt_at IS NOT NULL AND next_attempt_at > now()
  GROUP BY aggregate_type, aggregate_id
), pending AS MATERIALIZED (
  SELECT bucket, min(seq) AS first_seq
  FROM (SELECT o.bucket, o.seq FROM outbox_events o
        WHERE o.published_at IS NULL AND NOT o.held
          AND NOT EXISTS (SELECT 1 FROM blocked b
                          WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
                            AND b.from_seq <= o.seq)
        ORDER BY o.seq LIMIT %(scan)s) head
  GROUP BY bucket
  ORDER BY first_seq
), mine AS MATERIALIZED (
  SELECT bucket FROM pending
  WHERE pg_try_advisory_xact_lock(%(lock_class)s, bucket)
  LIMIT %(buckets)s
)
-- Also: whether pending work was left to others (buckets taken, or beyond
-- this claim's share), so the relay goes on
-- instead of waiting for a NOTIFY; and in how many seconds the next held row
-- is due (negative: due already), so the relay releases it then. The buckets go to
-- claim_rows through a transaction-local setting, so the relay can send BEGIN
-- and both statements in one round trip.
SELECT set_config('seamq.relay_buckets', coalesce((SELECT array_agg(bucket) FROM mine), '{}')::text, true),
       (SELECT count(*) FROM pending) > (SELECT count(*) FROM mine),
       (SELECT extract(epoch FROM min(deliver_at) - now())::float8 FROM outbox_events WHERE held)

-- name: claim_rows
-- A statement of its own, after claim_buckets: its snapshot must be taken
-- once the bucket locks are held. In one statement the snapshot predates a
-- lock that the previous holder released at commit, so the rows it read are
-- stale: a row that holder had just put into backoff is dropped on recheck
-- while its aggregate's later rows, unchanged, are not, and go out first.
--
-- An aggregate waits behind its own earlier row that is backing off. Those rows
-- are gathered once per claim (idx_outbox_backoff, in this claim's buckets), not
-- looked up per candidate: a lookup per candidate is as fast as the plan the
-- statistics pick for it, and statistics taken with nothing pending once picked
-- a walk of every pending row per candidate (migration 0009).
WITH mine AS MATERIALIZED (
  SELECT unnest(CAST(current_setting('seamq.relay_buckets') AS smallint[])) AS bucket
), blocked AS MATERIALIZED (
  SELECT aggregate_type, aggregate_id, min(seq) AS from_seq FROM outbox_events
  WHERE published_at IS NULL AND next_attempt_at IS NOT NULL AND next_attempt_at > now()
    AND bucket = ANY (ARRAY(SELECT bucket FROM mine))
  GROUP BY aggregate_type, aggregate_id
)
SELECT o.id, o.context, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version,
       o.payload::text AS payload, o.occurred_at, o.correlation_id, o.causation_id,
       o.traceparent, o.publish_attempts, o.bucket, o.deliver_at
FROM outbox_events o
WHERE o.published_at IS NULL AND NOT o.held
  -- Subqueries, so the setting is read once, not per row, and no bucket
  -- (all held by other relays) means no scan at all.
  AND (SELECT current_setting('seamq.relay_buckets')) <> '{}'
  AND o.bucket = ANY (ARRAY(SELECT bucket FROM mine))
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
  AND NOT EXISTS (SELECT 1 FROM blocked b
                  WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
                    AND b.from_seq < o.seq)
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE OF o

-- name: release_due
-- Delayed rows whose time has come stop being held (migration 0004), run by a
-- relay when the claim said one would be due. Its own short transaction, not
-- part of the claim: the claim stays a read that locks rows, and SKIP LOCKED
-- keeps two relays releasing at once from waiting on each other. A released
-- row does not wait for its aggregate's later rows: it goes out in seq order
-- with whatever of its aggregate is still unpublished, so a delayed event
-- never holds its aggregate back.
UPDATE outbox_events SET held = false
WHERE id IN (SELECT id FROM outbox_events WHERE held AND deliver_at <= now()
             ORDER BY deliver_at LIMIT 10000 FOR UPDATE SKIP LOCKED)

-- name: mark_published
UPDATE outbox_events o
SET published_at = clock_timestamp(), publish_attempts = o.publish_attempts + 1,
    publish_error = NULL, next_attempt_at = NULL, stream_seq = u.stream_seq
FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(seqs)s AS bigint[])) AS u(id, stream_seq)
WHERE o.id = u.id AND o.part = seamq_id_time(u.id)

-- name: mark_failed
-- A failed row waits the delay the relay gave it (seamq.backoff, from its attempts); a
-- transport failure (broker unreachable) has none, the relay waits instead.
-- A row that can never be published as it is gets parked (migration 0007).
UPDATE outbox_events o
SET publish_attempts = o.publish_attempts + 1,
    publish_error = left(u.error, 2000),
    next_attempt_at = CASE WHEN u.park THEN CAST('infinity' AS timestamptz)
                           WHEN u.delay IS NOT NULL THEN now() + u.delay * interval '1 second' END,
    parked_reason = CASE WHEN u.park THEN left(u.error, 2000) END,
    parked_at = CASE WHEN u.park THEN clock_timestamp() END
FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(errors)s AS text[]), CAST(%(delays)s AS float8[]),
            CAST(%(park)s AS boolean[]))
  AS u(id, error, delay, park)
WHERE o.id = u.id AND o.part = seamq_id_time(u.id)

-- name: outbox_parked
-- Parked rows for people (`seamq outbox parked`), oldest first.
SELECT id, context, aggregate_type, aggregate_id, event_type, event_version, parked_reason, parked_at, created_at
FROM outbox_events
WHERE parked_reason IS NOT NULL AND published_at IS NULL
  AND (CAST(%(context)s AS text) IS NULL OR context = %(context)s)
  AND (CAST(%(id)s AS uuid) IS NULL OR id = %(id)s)
ORDER BY parked_at
LIMIT %(limit)s

-- name: outbox_unpark
-- Parked rows back to the relay, now; under another context when `to` is given
-- (a typo'd context). Returns how many.
UPDATE outbox_events
SET parked_reason = NULL, parked_at = NULL, next_attempt_at = NULL, publish_error = NULL,
    context = coalesce(CAST(%(to)s AS text), context)
WHERE parked_reason IS NOT NULL AND published_at IS NULL
  AND (CAST(%(context)s AS text) IS NULL OR context = %(context)s)
  AND (CAST(%(id)s AS uuid) IS NULL OR id = %(id)s)

-- name: outbox_drop_parked
DELETE FROM outbox_events
WHERE parked_reason IS NOT NULL AND published_at IS NULL
  AND (CAST(%(context)s AS text) IS NULL OR context = %(context)s)
  AND (CAST(%(id)s AS uuid) IS NULL OR id = %(id)s)

-- name: outbox_backlog
-- Rows held for a later deliver_at are counted apart ("delayed"): they are not
-- late; parked rows too (migration 0007): no relay will publish them. The oldest row is by when it could first be published.
-- Read through the two indexes that hold exactly the unpublished rows (pending, held), so it
-- costs what is unpublished, never the history (migration 0009).
SELECT context, count(*) FILTER (WHERE NOT held AND parked_reason IS NULL) AS count,
       min(greatest(occurred_at, deliver_at)) FILTER (WHERE NOT held AND parked_reason IS NULL) AS oldest_at,
       count(*) FILTER (WHERE publish_error IS NOT NULL AND parked_reason IS NULL) AS failing,
       count(*) FILTER (WHERE held) AS delayed,
       count(*) FILTER (WHERE parked_reason IS NOT NULL) AS parked
FROM (SELECT context, held, parked_reason, publish_error, occurred_at, deliver_at FROM outbox_events
      WHERE published_at IS NULL AND NOT held
      UNION ALL
      SELECT context, held, parked_reason, publish_error, occurred_at, deliver_at FROM outbox_events
      WHERE published_at IS NULL AND held) unpublished
GROUP BY context ORDER BY context

-- name: inbox_backlog
SELECT consumer, count(*) AS count, min(received_at) AS oldest_at
FROM inbox_messages WHERE processed_at IS NULL AND status = 'received'
GROUP BY consumer ORDER BY consumer

-- name: migrations_table
CREATE TABLE IF NOT EXISTS seamq_migrations (
  version INT PRIMARY KEY,
  name TEXT NOT NULL,
  checksum TEXT NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)

-- name: migrations_lock
-- One migrator at a time: a second process waits here, then finds nothing to do.
SELECT pg_advisory_xact_lock(7103, 0)

-- name: migrations_applied
SELECT version, name, checksum, applied_at FROM seamq_migrations ORDER BY version

-- name: migrations_record
INSERT INTO seamq_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: migrations_table_exists
SELECT to_regclass('seamq_migrations') IS NOT NULL AS present

-- name: inbox_insert
-- Record messages before processing (REQ-051). New rows come back; rows that
-- already exist are read by inbox_lock. Sorted, so two consumers claiming
-- overlapping batches lock rows in one order and cannot deadlock.
-- New rows go in already marked processed: nearly all are, and no one sees
-- the mark before this transaction commits. Those whose handling did not
-- succeed are put back by inbox_not_processed before the commit. A second
-- write per message (an UPDATE touching three indexes) cost PostgreSQL about
-- 40 us per message and the consumer a round trip per transaction (measured).
-- The rows come as one JSON array of [id, subject, type, version,
-- occurred_at, deliver_at]: six typed arrays cost the consumer more CPU to send.
INSERT INTO inbox_messages
  (consumer, message_id, subject, event_type, event_version, occurred_at, deliver_at, attempts, status,
   processed_at, part)
SELECT %(consumer)s, (m->>0)::uuid, m->>1, m->>2, (m->>3)::int, (m->>4)::timestamptz, (m->>5)::timestamptz, 1,
       'processed', clock_timestamp(), seamq_id_time((m->>0)::uuid)
FROM jsonb_array_elements(CAST(%(items)s AS jsonb)) AS m
ORDER BY 2
ON CONFLICT (consumer, message_id, part) DO NOTHING
RETURNING message_id::text

-- name: inbox_lock
-- Existing rows, locked until this transaction ends: a concurrent redelivery
-- of the same message waits here, then sees it processed.
SELECT i.message_id, i.status, i.attempts
FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
JOIN inbox_messages i ON i.consumer = %(consumer)s AND i.message_id = u.id AND i.part = seamq_id_time(u.id)
ORDER BY i.message_id
FOR UPDATE OF i

-- name: inbox_replay
-- A DLQ replay arrived: process again, in a new round of attempts (the
-- history keeps the old ones). A retry needs no write here: `attempts` counts
-- what the handler did, and inbox_record writes it with the outcome.
UPDATE inbox_messages i SET attempts = 0, status = 'received'
FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
WHERE i.consumer = %(consumer)s AND i.message_id = u.id AND i.part = seamq_id_time(u.id)

-- name: inbox_duplicate
UPDATE inbox_messages i SET duplicates = i.duplicates + 1
FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
WHERE i.consumer = %(consumer)s AND i.message_id = u.id AND i.part = seamq_id_time(u.id)

-- name: inbox_record
-- What became of a lane's messages, in one statement, only for rows that
-- change: `processed` (a retry or replay handled), `received` (a new row,
-- inserted as processed by inbox_insert, that was not handled after all; or
-- a failed attempt, with its error), `dead_lettered` (with the DLQ copy's
-- place), `keep` (only the count of copies skipped as duplicates). `attempts`
-- is the handler's count now; a failed attempt also goes to its history.
-- last_error stays when a retry succeeds: it is the last error, not a state. A replay handled
-- has no next replay: its watchdog time goes (it showed on a processed message).
WITH u AS (
  SELECT * FROM jsonb_to_recordset(CAST(%(rows)s AS jsonb)) AS u(
    id uuid, state text, error text, reason text, detail text, dlq_subject text, dlq_seq bigint, copies int,
    attempts int, failed text)
), history AS (
  INSERT INTO inbox_attempts (consumer, message_id, attempt, error, part)
  SELECT %(consumer)s, u.id, u.attempts, left(u.failed, 2000), seamq_id_time(u.id) FROM u WHERE u.failed IS NOT NULL
)
UPDATE inbox_messages i
SET status = CASE u.state WHEN 'keep' THEN i.status ELSE u.state END,
    processed_at = CASE u.state WHEN 'processed' THEN clock_timestamp() WHEN 'keep' THEN i.processed_at END,
    attempts = coalesce(u.attempts, i.attempts),
    last_error = CASE u.state
      WHEN 'dead_lettered' THEN left(u.reason || ': ' || u.detail, 2000)
      ELSE coalesce(left(u.error, 2000), i.last_error) END,
    duplicates = i.duplicates + u.copies,
    dlq_metadata = CASE WHEN u.state = 'dead_lettered' THEN coalesce(i.dlq_metadata, '{}'::jsonb) || jsonb_build_object(
      'reason', u.reason, 'detail', left(u.detail, 2000), 'dlq_subject', u.dlq_subject,
      'dlq_seq', u.dlq_seq, 'dead_lettered_at', clock_timestamp(), 'next_replay_at', NULL)
      WHEN u.state = 'processed' THEN i.dlq_metadata - 'next_replay_at'
      ELSE i.dlq_metadata END
FROM u
WHERE i.consumer = %(consumer)s AND i.message_id = u.id AND i.part = seamq_id_time(u.id)

-- name: inbox_failed_alone
-- A message whose own transaction failed (nothing of it committed): its
-- attempt counted and kept apart, so a bug it shows ends in the DLQ after
-- max_deliver attempts. Returns the attempts now.
WITH row AS (
  INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, occurred_at, deliver_at,
                              attempts, status, last_error, part)
  VALUES (%(consumer)s, %(id)s, %(subject)s, %(event_type)s, %(event_version)s, %(occurred_at)s, %(deliver_at)s, 1,
          'received', left(%(error)s, 2000), seamq_id_time(CAST(%(id)s AS uuid)))
  ON CONFLICT (consumer, message_id, part) DO UPDATE
    SET attempts = inbox_messages.attempts + 1, last_error = excluded.last_error
  RETURNING attempts
), history AS (
  INSERT INTO inbox_attempts (consumer, message_id, attempt, error, part)
  SELECT %(consumer)s, %(id)s, attempts, left(%(error)s, 2000), seamq_id_time(CAST(%(id)s AS uuid)) FROM row
)
SELECT attempts FROM row

-- name: inbox_attempts
-- A message's failed attempts, oldest first.
SELECT attempt, failed_at, error FROM inbox_attempts
WHERE consumer = %(consumer)s AND message_id = %(id)s AND part = seamq_id_time(CAST(%(id)s AS uuid))
ORDER BY failed_at

-- name: dashboard_outbox
SELECT context, count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
       count(*) FILTER (WHERE published_at IS NULL) AS backlog
FROM outbox_events GROUP BY context ORDER BY context

-- name: dashboard_inbox
-- Latency percentiles over the last minute of processing.
SELECT consumer,
       count(*) FILTER (WHERE status = 'processed') AS processed,
       coalesce(sum(duplicates), 0) AS duplicates,
       count(*) FILTER (WHERE status IN ('dead_lettered', 'exhausted')) AS dead_lettered,
       count(*) FILTER (WHERE status = 'received') AS retrying,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))
         FILTER (WHERE processed_at > now() - interval '1 minute') AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))
         FILTER (WHERE processed_at > now() - interval '1 minute') AS p99
FROM inbox_messages GROUP BY consumer ORDER BY consumer

-- name: replay_exhaust
-- Dead letters that used up their automatic replays stay in the DLQ, marked.
UPDATE inbox_messages
SET status = 'exhausted', dlq_metadata = dlq_metadata || jsonb_build_object('exhausted_at', clock_timestamp())
WHERE status = 'dead_lettered' AND dlq_metadata->>'reason' = ANY(%(reasons)s)
  AND coalesce((dlq_metadata->>'replay_attempts')::int, 0) >= %(max_attempts)s

-- name: replay_unscheduled
-- Replayable dead letters without a schedule, with the replays they had: the
-- replay worker draws each one's delay (seamq.backoff) and passes it to replay_schedule.
SELECT consumer, message_id, part, coalesce((dlq_metadata->>'replay_attempts')::int, 0) AS attempts
FROM inbox_messages
WHERE status = 'dead_lettered' AND dlq_metadata->>'next_replay_at' IS NULL
  AND dlq_metadata->>'reason' = ANY(%(reasons)s)
  AND coalesce((dlq_metadata->>'replay_attempts')::int, 0) < %(max_attempts)s
FOR UPDATE SKIP LOCKED

-- name: replay_schedule
-- The delay drawn is kept (replay_delay), so a person can see why a replay waits.
UPDATE inbox_messages i
SET dlq_metadata = i.dlq_metadata || jsonb_build_object(
      'next_replay_at', clock_timestamp() + d.delay * interval '1 second',
      'replay_delay', d.delay, 'replay_scheduled_at', clock_timestamp())
FROM unnest(%(consumers)s::text[], %(ids)s::uuid[], %(parts)s::timestamptz[], %(delays)s::float8[])
     AS d(consumer, message_id, part, delay)
WHERE i.consumer = d.consumer AND i.message_id = d.message_id AND i.part = d.part

-- name: replay_due
SELECT consumer, message_id, dlq_metadata FROM inbox_messages
WHERE status = 'dead_lettered' AND (dlq_metadata->>'next_replay_at')::timestamptz <= clock_timestamp()
ORDER BY (dlq_metadata->>'next_replay_at')::timestamptz
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: replay_mark
-- After the re-publish: count it, and arm a watchdog in case the replay never
-- comes back (the consumer clears it when it dead-letters the message again).
UPDATE inbox_messages
SET status = CASE WHEN status = 'exhausted' THEN 'dead_lettered' ELSE status END,
    dlq_metadata = dlq_metadata || jsonb_build_object(
      'replay_attempts', coalesce((dlq_metadata->>'replay_attempts')::int, 0) + 1,
      'last_replayed_at', clock_timestamp(),
      'last_reason', dlq_metadata->>'reason',
      'next_replay_at', clock_timestamp() + %(watchdog)s * interval '1 second')
WHERE consumer = %(consumer)s AND message_id = %(message_id)s AND part = seamq_id_time(CAST(%(message_id)s AS uuid))

-- name: dlq_where
-- Which dead letters a selection means: every filter is optional (NULL means any). Closed ones
-- (purged, or edited and replayed as a new message) only with `purged`.
status IN ('dead_lettered', 'exhausted')
  AND (CAST(%(consumer)s AS text) IS NULL OR consumer = %(consumer)s)
  AND (CAST(%(context)s AS text) IS NULL OR split_part(consumer, %(separator)s, 1) = %(context)s)
  AND (CAST(%(event_type)s AS text) IS NULL OR event_type = %(event_type)s)
  AND (CAST(%(reason)s AS text) IS NULL OR dlq_metadata->>'reason' = %(reason)s)
  AND (CAST(%(older_than)s AS float8) IS NULL
       OR (dlq_metadata->>'dead_lettered_at')::timestamptz < now() - %(older_than)s * interval '1 second')
  AND (CAST(%(since)s AS timestamptz) IS NULL OR received_at >= %(since)s)
  AND (CAST(%(until)s AS timestamptz) IS NULL OR received_at < %(until)s)
  AND (CAST(%(text)s AS text) IS NULL OR strpos(lower(coalesce(last_error, '')), lower(%(text)s)) > 0)
  AND (CAST(%(cause)s AS text) IS NULL OR seamq_dlq_cause(dlq_metadata->>'reason', last_error) = %(cause)s)
  AND (CAST(%(ids)s AS uuid[]) IS NULL OR message_id = ANY(%(ids)s))
  AND (CAST(%(prefix)s AS text) IS NULL OR message_id::text LIKE %(prefix)s || '%%')
  AND (%(purged)s OR (dlq_metadata->>'purged_at' IS NULL AND dlq_metadata->>'edited_as' IS NULL))

-- name: dlq_select
-- Dead letters for people, oldest first, with how many the selection holds beyond the limit.
SELECT consumer, message_id, subject, event_type, event_version, status, attempts, last_error,
       dlq_metadata, received_at, seamq_dlq_cause(dlq_metadata->>'reason', last_error) AS cause,
       count(*) OVER () AS total
FROM inbox_messages
WHERE {dlq_where}
ORDER BY (dlq_metadata->>'dead_lettered_at')::timestamptz, message_id
LIMIT %(limit)s

-- name: dlq_groups
-- Dead letters grouped by cause (seamq_dlq_cause), the largest group first.
SELECT seamq_dlq_cause(dlq_metadata->>'reason', last_error) AS cause, dlq_metadata->>'reason' AS reason,
       count(*) AS count, count(DISTINCT consumer) AS consumers, min(received_at) AS first_at,
       max(received_at) AS last_at
FROM inbox_messages
WHERE {dlq_where}
GROUP BY 1, 2 ORDER BY count(*) DESC, 1
LIMIT 200

-- name: inbox_show
-- Inbox rows for people, by message id or a prefix of one, in any state.
SELECT consumer, message_id, subject, event_type, event_version, status, attempts, duplicates, last_error,
       received_at, processed_at, dlq_metadata
FROM inbox_messages
WHERE message_id::text LIKE %(prefix)s || '%%'
ORDER BY message_id, consumer
LIMIT 50

-- name: dlq_purged
-- Purged dead letters keep their inbox row (it still deduplicates), marked.
UPDATE inbox_messages
SET status = 'exhausted', dlq_metadata = dlq_metadata || jsonb_build_object('purged_at', clock_timestamp(),
      'next_replay_at', NULL)
WHERE consumer = %(consumer)s AND message_id = %(message_id)s AND part = seamq_id_time(CAST(%(message_id)s AS uuid))

-- name: action_start
INSERT INTO operator_actions (actor, action, selected, message_ids, detail)
VALUES (%(actor)s, %(action)s, %(selected)s, %(message_ids)s, %(detail)s)
RETURNING id

-- name: action_finish
UPDATE operator_actions SET finished_at = clock_timestamp(), done = %(done)s, detail = detail || %(detail)s
WHERE id = %(id)s

-- name: actions_recent
SELECT id, started_at, finished_at, actor, action, selected, done, cardinality(message_ids) AS messages, detail
FROM operator_actions ORDER BY id DESC LIMIT %(limit)s

-- name: actions_of_message
SELECT id, started_at, finished_at, actor, action, selected, done, cardinality(message_ids) AS messages, detail
FROM operator_actions WHERE message_ids @> ARRAY[CAST(%(id)s AS uuid)] ORDER BY id

-- name: dlq_edited
-- The original of an edit-and-replay is closed: its edited copy is a new message that names it.
UPDATE inbox_messages
SET status = 'exhausted', dlq_metadata = dlq_metadata || jsonb_build_object('edited_as', CAST(%(new_id)s AS text),
      'edited_at', clock_timestamp(), 'edited_by', CAST(%(actor)s AS text), 'next_replay_at', NULL)
WHERE consumer = %(consumer)s AND message_id = %(message_id)s AND part = seamq_id_time(CAST(%(message_id)s AS uuid)) AND status IN ('dead_lettered', 'exhausted')
  AND dlq_metadata->>'edited_as' IS NULL

-- name: console_published
-- Published per context in the last minute (idx_outbox_published_at): the console's rate.
SELECT context, count(*) AS published FROM outbox_events
WHERE published_at > now() - interval '60 seconds' GROUP BY context

-- name: console_inbox
-- Per consumer, from indexed ranges only (the overview answers in milliseconds with 1M inbox rows):
-- deliveries handled over the last minute and their latency (commit to handled), replays apart
-- (a DLQ replay, or an edited copy: the time a dead letter waited for an operator is not the
-- pipeline's), dead letters open, and messages dead-lettered in the last hour, whatever became of
-- them since (migration 0010).
WITH edited AS MATERIALIZED (  -- edited copies, named by their originals
  SELECT consumer, CAST(dlq_metadata->>'edited_as' AS uuid) AS message_id,
         CAST(dlq_metadata->>'edited_at' AS timestamptz) AS replayed_at
  FROM inbox_messages WHERE status IN ('dead_lettered', 'exhausted') AND dlq_metadata ? 'edited_as'
), recent AS MATERIALIZED (
  SELECT i.consumer, extract(epoch FROM i.processed_at - i.occurred_at) AS latency,
         i.dlq_metadata IS NULL AND e.message_id IS NULL AS live,
         extract(epoch FROM i.processed_at - coalesce(e.replayed_at,
                 CAST(i.dlq_metadata->>'last_replayed_at' AS timestamptz))) AS since_replay
  FROM inbox_messages i LEFT JOIN edited e ON e.consumer = i.consumer AND e.message_id = i.message_id
  WHERE i.processed_at > now() - interval '60 seconds' AND i.status = 'processed'
)
SELECT c.consumer, coalesce(h.handled, 0) AS handled, h.p50, h.p99, coalesce(h.replayed, 0) AS replayed,
       h.replay_p99, coalesce(d.open, 0) AS dead_open, coalesce(x.last_hour, 0) AS dead_last_hour
FROM (SELECT DISTINCT consumer FROM recent
      UNION SELECT consumer FROM inbox_messages WHERE status IN ('dead_lettered', 'exhausted') GROUP BY consumer) c
LEFT JOIN (SELECT consumer, count(*) FILTER (WHERE live) AS handled,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY latency) FILTER (WHERE live) AS p50,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY latency) FILTER (WHERE live) AS p99,
                  count(*) FILTER (WHERE NOT live) AS replayed,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY since_replay) FILTER (WHERE NOT live) AS replay_p99
           FROM recent GROUP BY consumer) h
  ON h.consumer = c.consumer
LEFT JOIN (SELECT consumer, count(*) AS open FROM inbox_messages
           WHERE status IN ('dead_lettered', 'exhausted') AND dlq_metadata->>'purged_at' IS NULL
             AND dlq_metadata->>'edited_as' IS NULL GROUP BY consumer) d
  ON d.consumer = c.consumer
LEFT JOIN (SELECT consumer, count(*) AS last_hour FROM inbox_messages
           WHERE dlq_metadata IS NOT NULL
             AND CAST(dlq_metadata->>'dead_lettered_at' AS timestamptz) > now() - interval '1 hour'
           GROUP BY consumer) x
  ON x.consumer = c.consumer
ORDER BY c.consumer

-- name: console_processes
-- seamq's processes as PostgreSQL sees them (each names itself: "seamq relay pid 12").
SELECT application_name AS name, count(*) AS connections, min(backend_start) AS since
FROM pg_stat_activity WHERE application_name LIKE 'seamq %%' GROUP BY application_name ORDER BY 1

-- name: console_session_generation
-- A console user's session generation (migration 0011): 0 until they first sign out.
SELECT coalesce((SELECT generation FROM console_sessions WHERE user_name = %(user)s), 0)

-- name: console_sessions_end
-- Sign-out: every session of this user, on every console, ends with this generation.
INSERT INTO console_sessions (user_name, generation, ended_at) VALUES (%(user)s, 1, clock_timestamp())
ON CONFLICT (user_name) DO UPDATE SET generation = console_sessions.generation + 1, ended_at = clock_timestamp()
RETURNING generation

-- name: partitioning
-- The partitioned tables (migration 0013): the id their key is the time of, where their dated
-- partitions start, how long each is, how many are kept made ahead.
SELECT name, id_column, starts, every, ahead FROM seamq_partitioning ORDER BY name

-- name: partitions_dated
-- A table's dated partitions with their ranges, oldest first (not its legacy or default ones).
SELECT c.relname, CAST(b[1] AS timestamptz), CAST(b[2] AS timestamptz)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
     LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b
WHERE i.inhparent = CAST(%(table)s AS regclass) AND b IS NOT NULL
ORDER BY 2

-- name: partition_columns
-- The columns an INSERT writes: the generated one (the outbox's bucket) is computed again.
SELECT attname FROM pg_attribute
WHERE attrelid = CAST(%(table)s AS regclass) AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
ORDER BY attnum

-- name: partitions_detached
-- Dated partitions detached by a drop whose files are still to be deleted (seamq.pg.partitions).
SELECT relname FROM pg_class
WHERE relkind = 'r' AND NOT relispartition AND relnamespace = CAST(current_schema() AS regnamespace)
  AND relname ~ ('^(outbox_events|inbox_messages|inbox_attempts)_p[0-9]+_[0-9]+' || %(suffix)s || '$')

-- name: partition_vacuums_cancel
SELECT pg_cancel_backend(pid) FROM pg_stat_progress_vacuum WHERE relid = ANY(CAST(%(names)s AS regclass[]))
UNION ALL
SELECT pg_cancel_backend(pid) FROM pg_stat_progress_analyze WHERE relid = ANY(CAST(%(names)s AS regclass[]))

-- name: audit_cursor
SELECT at, id, seq FROM audit_cursors WHERE walk = %(walk)s

-- name: audit_cursor_save
INSERT INTO audit_cursors (walk, at, id, seq) VALUES (%(walk)s, %(at)s, %(id)s, %(seq)s)
ON CONFLICT (walk) DO UPDATE SET at = excluded.at, id = excluded.id, seq = excluded.seq, updated_at = clock_timestamp()

-- name: audit_now
SELECT clock_timestamp()

-- name: audit_published
-- A context's rows published after (at, id) and at least `settle` seconds ago (a relay's marks commit
-- within that), oldest first.
SELECT id, stream_seq, published_at FROM outbox_events
WHERE context = %(context)s AND published_at IS NOT NULL AND published_at >= %(at)s AND (published_at, id) > (%(at)s, %(id)s)
  AND published_at < clock_timestamp() - make_interval(secs => %(settle)s)
ORDER BY published_at, id LIMIT %(limit)s

-- name: audit_outbox_has
-- Which of these ids have an outbox row (a legacy row's part is the epoch: migration 0013).
SELECT o.id FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
JOIN outbox_events o ON o.id = u.id AND o.part IN (seamq_id_time(u.id), 'epoch')

-- name: audit_outbox_rows
-- Rows to publish again, as the relay reads them (ports.OutboxRow).
SELECT o.id, o.context, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version, o.payload::text,
       o.occurred_at, o.correlation_id, o.causation_id, o.traceparent, o.publish_attempts, o.bucket, o.deliver_at
FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
JOIN outbox_events o ON o.id = u.id AND o.part IN (seamq_id_time(u.id), 'epoch')

-- name: audit_inbox_done
-- Which of these messages the consumer has finished: processed, or dead-lettered (replays exhausted too).
SELECT i.message_id FROM unnest(CAST(%(ids)s AS uuid[])) AS u(id)
JOIN inbox_messages i ON i.consumer = %(consumer)s AND i.message_id = u.id AND i.part IN (seamq_id_time(u.id), 'epoch')
WHERE i.status IN ('processed', 'dead_lettered', 'exhausted')

-- name: audit_found
-- Findings, each once: what was found before is not found again (RETURNING: the new ones).
INSERT INTO audit_findings (kind, scope, message_id, stream, stream_seq, detail)
SELECT f->>'kind', f->>'scope', (f->>'message_id')::uuid, f->>'stream', (f->>'stream_seq')::bigint, f->>'detail'
FROM jsonb_array_elements(CAST(%(findings)s AS jsonb)) AS f
ON CONFLICT (kind, scope, message_id) DO NOTHING
RETURNING message_id

-- name: audit_unrepaired
SELECT message_id FROM audit_findings
WHERE kind = 'not_in_stream' AND scope = %(context)s AND repaired_at IS NULL ORDER BY stream_seq LIMIT %(limit)s

-- name: audit_repaired
-- Published again: the finding says where the copy went, and so does the row, which later walks check.
WITH u AS (SELECT * FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(seqs)s AS bigint[])) AS u(id, seq)),
     f AS (UPDATE audit_findings a SET repaired_at = clock_timestamp(), repair_seq = u.seq FROM u
           WHERE a.kind = 'not_in_stream' AND a.scope = %(context)s AND a.message_id = u.id)
UPDATE outbox_events o SET stream_seq = u.seq FROM u
WHERE o.id = u.id AND o.part IN (seamq_id_time(u.id), 'epoch')

-- name: audit_findings
SELECT kind, scope, message_id, stream, stream_seq, found_at, repaired_at, repair_seq, detail FROM audit_findings
WHERE found_at >= %(since)s ORDER BY found_at DESC, message_id LIMIT %(limit)s

-- name: audit_findings_count
SELECT kind, scope, count(*), count(repaired_at) FROM audit_findings GROUP BY kind, scope ORDER BY kind, scope

-- name: audit_walks
SELECT walk, at, seq, updated_at FROM audit_cursors ORDER BY walk
