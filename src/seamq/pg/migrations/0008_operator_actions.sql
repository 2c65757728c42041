-- What people did to what seamq holds (issue 30): every replay, purge and edit-and-replay, from
-- the console or the CLI, who did it, when, how many were selected and how many it did. A row is
-- written before the action starts and finished after it, so an action cut short shows as unfinished
-- (finished_at NULL), never as done.
CREATE TABLE operator_actions (
  id          BIGSERIAL PRIMARY KEY,
  started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  finished_at TIMESTAMPTZ,
  actor       TEXT NOT NULL,                 -- "console:alice", "cli:root"
  action      TEXT NOT NULL,                 -- dlq.replay, dlq.purge, dlq.edit_replay, jobs.retry, ...
  selected    INT NOT NULL,
  done        INT,
  message_ids UUID[] NOT NULL DEFAULT '{}',  -- the messages it was for (a message page lists its actions)
  detail      JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX idx_operator_actions_messages ON operator_actions USING gin (message_ids);
CREATE INDEX idx_operator_actions_started ON operator_actions (started_at);

-- The cause a dead letter is grouped by: its reason and its error with the parts that differ from
-- message to message (ids, numbers) blanked, cut to 120 characters (the reason is not said twice when
-- the error begins with it). One definition for the console's
-- groups and its filter by group.
CREATE FUNCTION seamq_dlq_cause(reason TEXT, error TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(reason, '?') || ': ' || left(regexp_replace(
    CASE WHEN left(error, length(reason) + 2) = reason || ': ' THEN substr(error, length(reason) + 3)
         ELSE coalesce(error, '') END,
    '[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|[0-9]+', '#', 'g'), 120)
$$;

