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
        home = _compiled_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)
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
def _compiled_spark_home() -> Path | None:
    """pip's pyspark as SPARK_HOME, less `python/lib/pyspark.zip`; None where the user set one.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path, and Python
    compiles what it imports from a zip each time, caching nothing. A worker then starts in three
    times the CPU of one importing the installed, compiled package, and Spark gives it a hard-coded
    10 s to connect back: a busy machine failed queries that way. Locally the workers run this
    interpreter, which has pyspark installed, so without the zip they import that."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    if "SPARK_HOME" in os.environ or not (package / "python" / "lib" / "pyspark.zip").exists():
        return None
    home = Path(tempfile.mkdtemp(prefix="seamq-spark-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # symlinks only: the package stays
    for entry in package.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    (home / "python" / "lib").mkdir(parents=True)
    for py4j in (package / "python" / "lib").glob("py4j-*.zip"):
        (home / "python" / "lib" / py4j.name).symlink_to(py4j)
    return home


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
