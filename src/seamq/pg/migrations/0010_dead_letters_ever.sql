-- The console's "dead-lettered in the last hour" counts each message dead-lettered in that hour,
-- whatever became of it since: replayed and handled, edited, purged or still open (issue 44: it
-- counted open rows received in that hour, 3 where 7 had been dead-lettered). Rows that were ever
-- dead-lettered keep their `dlq_metadata` (with `dead_lettered_at`), and are few: this index holds
-- them alone, so the count reads them and never the whole inbox.
CREATE INDEX idx_inbox_ever_dead_lettered ON inbox_messages (consumer) WHERE dlq_metadata IS NOT NULL;
