"""A SparkSession set up the way this stack needs it, on one machine or on a cluster.

`local[*]` (the default) runs everything in this process's JVM: the driver
binds to 127.0.0.1 and Python workers run this interpreter. Any other master
(`spark://`, `yarn`, `k8s://`) has executors on other machines that share
nothing with the driver, so nothing of the driver's is assumed there: they
run `pipeline.executor_python` (their own Python with pyspark, pyarrow and
seamq's dependencies, or an environment shipped with `spark.archives` in
`pipeline.conf`), seamq's own code goes with the job as a zip of the package
the driver runs, and the driver's addresses come from `pipeline.driver_host`
and `driver_bind_address`. Under `spark-submit` the master and conf it was
given stand. Spark's console noise is quiet unless asked for.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

from seamq.settings import PipelineSettings


def session(master: str | None = None, app: str = "seamq", *, quiet: bool = True,
            settings: PipelineSettings | None = None):
    settings = settings or PipelineSettings()
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # a JVM spark-submit started, with its own master
    master = master or (None if submitted else settings.master)
    local = master is not None and master.startswith("local")
    from pyspark.sql import SparkSession

    from seamq.pipeline.pg_source import PgDataSource
    from seamq.pipeline.source import JetStreamDataSource

    builder = (SparkSession.builder.appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC"))  # hour buckets in UTC, wherever it runs
    if master:
        builder = builder.master(master)
    if local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    elif not submitted:
        # Spark plans Python data sources in a Python it starts on the driver's host, and runs
        # them on the executors, with one interpreter: PYSPARK_PYTHON, read from this process's
        # environment when the JVM starts. There seamq comes from the zip, as on the executors.
        os.environ["PYSPARK_PYTHON"] = settings.executor_python
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_seamq_zip()), os.environ.get("PYTHONPATH")]))
        builder = builder.config("spark.pyspark.python", settings.executor_python)
        builder = builder.config("spark.pyspark.driver.python", sys.executable)
        for key, value in (("spark.driver.host", settings.driver_host),
                           ("spark.driver.bindAddress", settings.driver_bind_address)):
            if value:
                builder = builder.config(key, value)
    for key, value in settings.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    if not local:
        spark.sparkContext.addPyFile(str(_seamq_zip()))
    spark.dataSource.register(JetStreamDataSource)
    spark.dataSource.register(PgDataSource)
    return spark


@functools.cache
def _seamq_zip() -> Path:
    """The seamq package this driver runs, zipped for the executors (built once per process).
    Its dependencies are the executors' environment's: they include compiled extensions,
    which Python cannot import from a zip."""
    package = Path(__file__).resolve().parent.parent
    folder = tempfile.mkdtemp(prefix="seamq-spark-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # in use until the driver ends, gone after
    target = Path(folder) / "seamq.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, Path("seamq") / path.relative_to(package))
    return target


@contextmanager
def spark_session(master: str | None = None, app: str = "seamq", settings: PipelineSettings | None = None):
    """`session()` for one command: stopped when the command ends, however it ends."""
    spark = session(master, app, settings=settings)
    try:
        yield spark
    finally:
        spark.stop()
