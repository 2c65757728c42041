-- Signing out ends a console user's sessions, on every console instance (issue 44: a cookie kept
-- from before sign-out still opened the pages, since sessions were signed cookies and nothing was
-- kept on the server). A session carries its user's generation from sign-in; every request compares
-- it with the row here, and signing out moves the generation on. No row: generation 0.
CREATE TABLE console_sessions (
  user_name  TEXT PRIMARY KEY,
  generation BIGINT NOT NULL DEFAULT 0,
  ended_at   TIMESTAMPTZ              -- when the user last signed out
);
