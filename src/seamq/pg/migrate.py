"""Versioned schema migrations shipped inside the package.

Files are `migrations/NNNN_name.sql`. `upgrade` applies the missing ones in
one transaction under an advisory lock, so two processes upgrading at once
serialise and the second finds nothing to do. A checksum per applied file
catches a migration edited after it ran.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable
from importlib import resources

import psycopg
from psycopg.rows import dict_row

from seamq.model import ErrorCode, SeamqError
from seamq.pg import online, partitions
from seamq.pg.sql import query

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: datetime | None


def migrations() -> list[Migration]:
    found = []
    for entry in resources.files("seamq.pg").joinpath("migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def upgrade(dsn: str, progress: Callable[[str], None] = lambda line: None,
                  until: int | None = None) -> list[Migration]:
    """Apply what is missing (up to `until`); returns the migrations applied by this call. A
    migration with online steps (seamq.pg.online) has them run first, when the tables it changes
    exist."""
    wanted = [m for m in migrations() if until is None or m.version <= until]
    applied_before = {s.version for s in await status(dsn) if s.applied_at is not None}
    for migration in wanted:
        if migration.version - 1 in applied_before and migration.version not in applied_before:
            await online.prepare(dsn, migration.version, progress)
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        async with conn.transaction():
            await conn.execute(query("migrations_lock"))
            await conn.execute(query("migrations_table"))
            applied = {row["version"]: row for row in await (await conn.execute(query("migrations_applied"))).fetchall()}
            done = []
            for migration in wanted:
                row = applied.get(migration.version)
                if row is not None:
                    if row["checksum"] != migration.checksum:
                        raise SeamqError(
                            ErrorCode.MIGRATION_FAILED,
                            f"migration {migration.version:04d}_{migration.name} was changed after it was applied",
                        )
                    continue
                try:
                    await conn.execute(migration.sql)
                except psycopg.Error as exc:
                    raise SeamqError(
                        ErrorCode.MIGRATION_FAILED, f"{migration.version:04d}_{migration.name}: {exc}"
                    ) from exc
                await conn.execute(
                    query("migrations_record"),
                    dict(version=migration.version, name=migration.name, checksum=migration.checksum),
                )
                done.append(migration)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await partitions.make_ahead(conn)  # the dated partitions, from the start (migration 0013)
    return done


async def status(dsn: str) -> list[MigrationStatus]:
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        present = (await (await conn.execute(query("migrations_table_exists"))).fetchone())["present"]
        applied = {}
        if present:
            applied = {r["version"]: r for r in await (await conn.execute(query("migrations_applied"))).fetchall()}
    return [
        MigrationStatus(m.version, m.name, applied[m.version]["applied_at"] if m.version in applied else None)
        for m in migrations()
    ]


async def require_current(dsn: str) -> None:
    """Workers check the schema before they start: on a database without it a
    relay would otherwise fail every claim (every connection, since it prepares
    statements) until someone reads the logs."""
    pending = [s for s in await status(dsn) if s.applied_at is None]
    if pending:
        names = ", ".join(f"{s.version:04d}_{s.name}" for s in pending)
        raise SeamqError(ErrorCode.SCHEMA_OUTDATED, f"the database lacks migration {names}: run `seamq db upgrade`")
