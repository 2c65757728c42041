"""A PostgreSQL standby of an embedded server, for the failover tests (issue 47): copied from its
primary with pg_basebackup, streaming from it, promoted when the primary is gone."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from seamq.embedded.postgres import PostgresServer


class Standby(PostgresServer):
    def __init__(self, data_dir: Path, primary: PostgresServer) -> None:
        super().__init__(data_dir)
        self.primary = primary

    def _create(self) -> None:
        self._run([str(self.bin / "pg_basebackup"), "-D", str(self.data_dir), "-h", "127.0.0.1",
                   "-p", str(self.primary.port), "-U", "postgres", "-X", "stream", "-R", "--no-sync"])

    def promote(self) -> None:
        self._run([str(self.bin / "pg_ctl"), "promote", "-D", str(self.data_dir), "-w", "-t", "60"])

    def receiver_pid(self) -> int | None:
        """The process that receives the primary's WAL (stopped, it stops replication)."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
        return row[0] if row else None


def synchronous(primary: PostgresServer, on: bool) -> None:
    """A commit returns once the standby has it (on), or at once (off: asynchronous replication)."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{'*' if on else ''}'")
        conn.execute("SELECT pg_reload_conf()")


def wait_streaming(primary: PostgresServer, sync: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    wanted = "sync" if sync else "async"
    while True:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            states = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
        if ("streaming", wanted) in states:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the standby is not streaming ({wanted}): {states}")
        time.sleep(0.2)


def both(primary: PostgresServer, standby: PostgresServer, database: str) -> str:
    """A DSN that finds whichever of the two takes writes: what the workers are given."""
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{database}"
            "?target_session_attrs=read-write&connect_timeout=2")
