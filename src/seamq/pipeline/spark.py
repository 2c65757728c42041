"""A SparkSession set up the way this stack needs it.

Spark's Python workers must run the same interpreter (PYSPARK_PYTHON), the
driver must bind to 127.0.0.1 (SPARK_LOCAL_IP), and Spark's console noise is
quiet unless asked for. `master` is local[*] by default; any cluster URL works.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager


def session(master: str | None = None, app: str = "seamq", *, quiet: bool = True):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from seamq.pipeline.pg_source import PgDataSource
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
    spark.dataSource.register(PgDataSource)
    return spark


@contextmanager
def spark_session(master: str | None = None, app: str = "seamq"):
    """`session()` for one command: stopped when the command ends, however it ends."""
    spark = session(master, app)
    try:
        yield spark
    finally:
        spark.stop()
