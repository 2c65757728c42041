"""What a PostgreSQL failure means for a worker: the database is away (wait and retry everything),
or something about the work at hand (that work alone pays). Stated once for every repository."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout


def database_away(exc: BaseException) -> bool:
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))
