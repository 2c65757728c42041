-- Producers NOTIFY only while a relay sleeps (issue 14).
--
-- PostgreSQL serialises the commits of all transactions that ran NOTIFY: a
-- cluster-wide lock is held through each one's commit, WAL flush included.
-- Measured with 16 writers (pgbench, one-row transactions, fsync on): 4.0k
-- commits/s with a NOTIFY per transaction, 9.9k without.
--
-- A relay about to sleep holds advisory lock (7105, 0) exclusively (query
-- `wake_register`). A producer that can take it shared knows no relay sleeps,
-- skips the NOTIFY, and holds the shared lock to its end, so no relay can
-- register its sleep until the rows of every producer that skipped are
-- visible; the relay claims once more after registering. A producer never
-- waits for the lock: it either takes it or notifies.
CREATE OR REPLACE FUNCTION seamq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT pg_try_advisory_xact_lock_shared(7105, 0) THEN
    PERFORM pg_notify('seamq_outbox', '');
  END IF;
  RETURN NULL;
END $$;
