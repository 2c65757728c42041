"""What a PostgreSQL failure means for a worker: the database is away (wait and retry everything),
or something about the work at hand (that work alone pays). Stated once for every repository."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

from seamq.model import ErrorCode, SeamqError, describe


def database_away(exc: BaseException) -> bool:
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))


def coded(exc: BaseException) -> SeamqError | None:
    """A command's PostgreSQL failure as a person can act on it; None when it is none."""
    if isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
        return SeamqError(ErrorCode.DATABASE_UNAVAILABLE, f"{exc} (check SEAMQ_DATABASE_URL)".strip())
    if isinstance(exc, psycopg.Error):
        return SeamqError(ErrorCode.DATABASE_ERROR, describe(exc))
    return None
