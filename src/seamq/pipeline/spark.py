"""A SparkSession set up the way this stack needs it.

Spark's Python workers must run the same interpreter (PYSPARK_PYTHON), the
driver must bind to 127.0.0.1 (SPARK_LOCAL_IP), and Spark's console noise is
quiet unless asked for. `master` is local[*] by default; any cluster URL works.
"""

from __future__ import annotations

import os
import sys
import uuid
from contextlib import contextmanager


def session(master: str | None = None, app: str = "seamq", *, quiet: bool = True):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from seamq.pipeline.source import JetStreamDataSource

    builder = (SparkSession.builder.master(master or "local[*]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")  # hour buckets in UTC, wherever it runs
               .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JetStreamDataSource)
    return spark


@contextmanager
def spark_session(master: str | None = None, app: str = "seamq"):
    """`session()` for one command: stopped when the command ends, however it ends."""
    spark = session(master, app)
    try:
        yield spark
    finally:
        spark.stop()


def pg_frame(spark, dsn: str, sql: str):
    """A query's rows as a DataFrame, through psycopg and Arrow (no JDBC jar needed).

    The rows pass through the driver, so this suits the outbox and inbox sizes
    a reconcile or KPI run reads; UUIDs become strings (Arrow has no UUID type).
    """
    import psycopg
    import pyarrow as pa

    with psycopg.connect(dsn) as conn:
        cur = conn.execute(sql)
        names = [c.name for c in cur.description]
        rows = cur.fetchall()
    plain = lambda v: str(v) if isinstance(v, uuid.UUID) else v  # noqa: E731
    return spark.createDataFrame(pa.table({n: [plain(r[i]) for r in rows] for i, n in enumerate(names)}))
