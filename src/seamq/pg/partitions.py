"""The dated partitions of the outbox, the inbox and the attempts table (migration 0013): made
ahead by the workers themselves, dropped whole once their retention has passed.

Every key has a partition, so no insert ever fails for want of one: `*_legacy` holds what is
older than partitioning and every id that is no UUIDv7, the dated partitions what their ranges
say, and `*_default` the rest: a late copy of a message whose day was dropped, an id dated
beyond the partitions made, and the unfinished rows of a dropped day (an unpublished outbox row,
an open dead letter), moved there in the drop's transaction. Legacy and default rows are few and
purged by DELETE, as every row was before.

Each change takes the parent's lock for milliseconds, in one round trip: the lock goes when the
server is done, whatever the worker's event loop is busy with. `lock_timeout` keeps it from
queueing the relays and consumers behind a long query, and the next round tries again.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import AsyncIterator

import psycopg
from psycopg import sql

from seamq import tables
from seamq.observability import log
from seamq.pg.sql import query

LOCK_TIMEOUT = "200ms"
DETACHED = "_detached"  # a dropped partition's name until its files are deleted
MAINTAINER_LOCK = (7106, 0)  # one maintainer at a time, cluster-wide
# The rows of a dropped partition that live on in the default one (and the attempts of those
# messages). Each condition is one partial index's: the drop reads the few rows it keeps, never
# the day, while it holds the table.
UNFINISHED = {"outbox_events": ["published_at IS NULL AND NOT held", "held"], "inbox_messages": ["processed_at IS NULL"]}
# A partition stays while any of its rows was published, received or handled within the retention.
RECENT = {"outbox_events": ["published_at"], "inbox_messages": ["received_at", "processed_at"]}
# The attempts table follows the inbox: its partitions are dropped with the inbox's of one range.
FOLLOWS = {"inbox_attempts": "inbox_messages"}


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Dropped:
    partition: Partition
    moved: int  # unfinished rows moved to the default partition
    held: float  # seconds the tables were locked: the detach and the move
    took: float  # seconds in all, the checks before and the files' deletion after included


def _name(table: str, start: datetime) -> str:
    return f"{table}_p{start.astimezone(timezone.utc):%Y%m%d_%H%M}"


async def _plan(conn: psycopg.AsyncConnection) -> list[dict]:
    """The partitioned tables; none before migration 0013."""
    if not (await (await conn.execute("SELECT to_regclass('seamq_partitioning') IS NOT NULL")).fetchone())[0]:
        return []
    return await (await conn.execute(query("partitioning"))).fetchall()


async def dated(conn: psycopg.AsyncConnection, table: str) -> list[Partition]:
    """The dated partitions of `table`, oldest first."""
    rows = await (await conn.execute(query("partitions_dated"), dict(table=table))).fetchall()
    return [Partition(table, r[0], r[1], r[2]) for r in rows]


async def _columns(conn: psycopg.AsyncConnection, table: str) -> sql.Composed:
    """The columns an INSERT may write (not the generated ones)."""
    rows = await (await conn.execute(query("partition_columns"), dict(table=table))).fetchall()
    return sql.SQL(", ").join(sql.Identifier(r[0]) for r in rows)


@asynccontextmanager
async def _alone(conn: psycopg.AsyncConnection) -> AsyncIterator[None]:
    """One maintainer at a time, cluster-wide (a session lock: taken again by its holder, it nests)."""
    await conn.execute("SELECT pg_advisory_lock(%s, %s)", MAINTAINER_LOCK)
    try:
        yield
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s, %s)", MAINTAINER_LOCK)


async def make_ahead(conn: psycopg.AsyncConnection, now: datetime | None = None) -> list[Partition]:
    """The default partitions, and dated ones from the newest made (or the start) up to `ahead`
    spans past now. A row of the default partition that a new range covers moves into it."""
    async with _alone(conn):
        return await _make_ahead(conn, now or datetime.now(timezone.utc))


async def _make_ahead(conn: psycopg.AsyncConnection, now: datetime) -> list[Partition]:
    made = []
    for plan in await _plan(conn):
        table, key, starts, every, ahead = plan
        have, columns = await dated(conn, table), await _columns(conn, table)
        # The first one begins where now's span does (or at the start): never a partition per
        # day since 2020 on a new install.
        start = have[-1].end if have else max(starts, starts + (now - starts) // every * every)
        while start < now + every * ahead:
            end = start + every
            made.append(await _make(conn, Partition(table, _name(table, start), start, end), key, columns))
            start = end
    return made


async def _make(conn: psycopg.AsyncConnection, part: Partition, key: str, columns: sql.Composed) -> Partition:
    table, name = sql.Identifier(part.table), sql.Identifier(part.name)
    await _at_once(conn, [
        *_locking(part.table),
        sql.SQL("CREATE TEMP TABLE seamq_strays ON COMMIT DROP AS WITH moved AS ("
                " DELETE FROM {default} WHERE part >= {start} AND part < {end} RETURNING {columns})"
                " SELECT * FROM moved").format(default=sql.Identifier(f"{part.table}_default"), columns=columns,
                                               start=sql.Literal(part.start), end=sql.Literal(part.end)),
        sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
            name, table, sql.Literal(part.start), sql.Literal(part.end)),
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (part = seamq_id_time({}))").format(
            name, sql.Identifier(f"{part.name}_part_is_id_time"), sql.Identifier(key)),
        sql.SQL("INSERT INTO {} ({columns}) OVERRIDING SYSTEM VALUE SELECT {columns} FROM seamq_strays").format(
            table, columns=columns)])
    log.info("partition_made", partition=part.name, start=part.start.isoformat())
    return part


async def drop_expired(conn: psycopg.AsyncConnection, table: str, older_than: timedelta,
                       now: datetime | None = None) -> list[Dropped]:
    """Drops the dated partitions of `table` (and of the tables that follow it) whose range ended
    more than `older_than` ago and none of whose rows was written to within it, oldest first;
    their unfinished rows move to the default partition in the same transaction."""
    now = now or datetime.now(timezone.utc)
    cutoff = now - older_than
    followers = [follower for follower, leader in FOLLOWS.items() if leader == table]
    columns = {t: await _columns(conn, t) for t in (table, *followers)}
    days = [twin for follower in followers for twin in await dated(conn, follower)]
    dropped = []
    for part in await dated(conn, table):
        began = time.monotonic()
        if part.end > cutoff or await _recent(conn, part, cutoff):
            break
        twins = [twin for twin in days if (twin.start, twin.end) == (part.start, part.end)]
        await _stop_vacuums(conn, [part.name, *(twin.name for twin in twins)])
        statements = [*_locking(table, *(twin.table for twin in twins)),
                      sql.SQL("SET LOCAL enable_seqscan = off")]  # whatever the day's statistics say
        first = len(statements) + 1  # the day's first INSERT, after its DETACH
        statements += _detach_keeping(part, [sql.SQL(c) for c in UNFINISHED[table]], columns[table])
        for twin in twins:  # the attempts of the messages kept
            statements += _detach_keeping(twin, [sql.SQL(
                "(consumer, message_id) IN (SELECT consumer, message_id FROM {} WHERE {})").format(
                sql.Identifier(part.name), sql.SQL(c)) for c in UNFINISHED[table]], columns[twin.table])
        statements += [sql.SQL("ALTER TABLE {} RENAME TO {}").format(  # their files go after the locks do
            sql.Identifier(gone.name), sql.Identifier(gone.name + DETACHED)) for gone in (part, *twins)]
        locked = time.monotonic()
        moved = sum((await _at_once(conn, statements))[first:first + len(UNFINISHED[table])])
        held = time.monotonic() - locked
        await _drop_detached(conn)
        took = time.monotonic() - began
        log.info("partition_dropped", partition=part.name, moved=moved, held_ms=round(held * 1000), took_ms=round(took * 1000))
        dropped.append(Dropped(part, moved, held, took))
    return dropped


async def _stop_vacuums(conn: psycopg.AsyncConnection, names: list[str]) -> None:
    """A vacuum or analyze of a partition about to be dropped is work for nothing, and its lock
    would keep the drop waiting; it is cancelled where this role may (a superuser's), else the
    drop waits for a round in which none runs."""
    try:
        await conn.execute(query("partition_vacuums_cancel"), dict(names=names))
    except psycopg.errors.InsufficientPrivilege:
        pass


async def _drop_detached(conn: psycopg.AsyncConnection) -> None:
    """Partitions detached by a drop (or by one cut short before it was done): deleting their
    files, a table's worth of them, holds no lock any writer needs."""
    for (name,) in await (await conn.execute(query("partitions_detached"), dict(suffix=DETACHED))).fetchall():
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


async def _recent(conn: psycopg.AsyncConnection, part: Partition, cutoff: datetime) -> bool:
    for column in RECENT[part.table]:
        found = await (await conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} > %(cutoff)s)").format(
            sql.Identifier(part.name), sql.Identifier(column)), dict(cutoff=cutoff))).fetchone()
        if found[0]:
            return True
    return False


def _locking(*tables: str) -> list[sql.Composable]:
    """The parents alone, first, as every writer takes them: a writer waits milliseconds, never
    deadlocks, and a vacuum of some partition does not keep the change waiting."""
    return [sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)),
            sql.SQL("LOCK TABLE ONLY {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(", ").join(map(sql.Identifier, tables)))]


async def _at_once(conn: psycopg.AsyncConnection, statements: list[sql.Composable]) -> list[int]:
    """`statements` as one transaction in one round trip (a simple query of several statements
    is one transaction): the locks they take are let go when the server is done, never held
    while this client waits for its turn in a busy event loop, or one blocked by a query that
    waits for those very locks. The rows each statement changed."""
    assert conn.autocommit, "partition changes run on an autocommit connection"
    cur = await conn.execute(sql.SQL(";\n").join(statements))
    counts = [cur.rowcount]
    while cur.nextset():
        counts.append(cur.rowcount)
    return counts


def _detach_keeping(part: Partition, keep: list[sql.Composable], columns: sql.Composed) -> list[sql.Composable]:
    """Detach `part` and insert its rows matching `keep` through the parent, which routes them to
    the default partition now that no dated range covers them. The caller drops it."""
    return [sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(sql.Identifier(part.table), sql.Identifier(part.name)),
            *(sql.SQL("INSERT INTO {} ({columns}) OVERRIDING SYSTEM VALUE SELECT {columns} FROM {} WHERE {}").format(
                sql.Identifier(part.table), sql.Identifier(part.name), condition, columns=columns)
              for condition in keep)]


# Rows of the legacy and default partitions past their retention: deleted in bounded batches.
PURGE = {
    "outbox_events": "DELETE FROM {part} WHERE id IN (SELECT id FROM {part} WHERE published_at < %(cutoff)s "
                     "ORDER BY published_at LIMIT %(batch)s)",
    "inbox_messages": "DELETE FROM {part} WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM {part} "
                      "WHERE processed_at < %(cutoff)s ORDER BY processed_at LIMIT %(batch)s)",
    "inbox_attempts": "DELETE FROM {part} a WHERE NOT EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = "
                      "a.consumer AND i.message_id = a.message_id AND i.part = a.part) AND ctid IN "
                      "(SELECT ctid FROM {part} WHERE failed_at < %(cutoff)s LIMIT %(batch)s)",
}


@dataclass(frozen=True)
class Purged:
    table: str
    dropped: list[Dropped]
    deleted: int  # rows deleted from the legacy and default partitions

    def summary(self) -> tables.Purged:
        return tables.Purged(len(self.dropped), sum(d.moved for d in self.dropped), self.deleted)


async def purge(conn: psycopg.AsyncConnection, table: str, older_than: timedelta, batch: int = 5000,
                now: datetime | None = None) -> Purged:
    """`table`'s retention: whole dated partitions dropped, then the rows of its legacy and
    default partitions (and of the tables that follow it) deleted, a batch per transaction."""
    now = now or datetime.now(timezone.utc)
    async with _alone(conn):
        dropped = await drop_expired(conn, table, older_than, now)
    deleted = 0
    for each in (table, *(t for t, leader in FOLLOWS.items() if leader == table)):
        for part in (f"{each}_legacy", f"{each}_default"):
            if not (await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (part,))).fetchone())[0]:
                continue
            while True:
                cur = await conn.execute(sql.SQL(PURGE[each]).format(part=sql.Identifier(part)),
                                         dict(cutoff=now - older_than, batch=batch))
                deleted += cur.rowcount
                if cur.rowcount < batch:
                    break
    return Purged(table, dropped, deleted)


async def purged(conninfo: str, table: str, older_than_seconds: float, batch: int = 5000) -> tables.Purged:
    """`purge`, for a person's command, on an autocommit connection of its own (a batch per
    transaction), said as the faces show it."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        return (await purge(conn, table, timedelta(seconds=older_than_seconds), batch)).summary()


async def maintain(conn: psycopg.AsyncConnection, *, outbox: timedelta | None = None,
                   inbox: timedelta | None = None) -> list[Purged]:
    """One round, by one process at a time (an advisory lock; others skip the round): make ahead,
    then purge what the given retentions allow. A lock not had within LOCK_TIMEOUT ends the round;
    the next one tries again. `conn` is in autocommit mode."""
    got = await (await conn.execute("SELECT pg_try_advisory_lock(%s, %s)", MAINTAINER_LOCK)).fetchone()
    if not got[0]:
        return []
    try:
        await _drop_detached(conn)
        await make_ahead(conn)
        return [await purge(conn, table, older_than) for table, older_than in
                (("outbox_events", outbox), ("inbox_messages", inbox)) if older_than is not None]
    except psycopg.errors.LockNotAvailable:
        log.warning("partition_maintenance_lock_timeout", then="tried again next round")
        return []
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s, %s)", MAINTAINER_LOCK)
