-- A dead letter's cause keeps the handler's HTTP status (issue 44: "HTTP 422: ..." read "HTTP #:",
-- as if the status were an id). Ids and other numbers are still blanked, so a thousand failures of
-- one bug stay one group; the status is what tells a refusal (422) from a failure (500, 503).
CREATE OR REPLACE FUNCTION seamq_dlq_cause(reason TEXT, error TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(reason, '?') || ': ' || left(regexp_replace(
    CASE WHEN left(error, length(reason) + 2) = reason || ': ' THEN substr(error, length(reason) + 3)
         ELSE coalesce(error, '') END,
    '[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|(?<!HTTP )(?<![0-9])[0-9]+', '#', 'g'), 120)
$$;
