"""`seamq pipeline lake`, `kpis` and `reconcile` on a Spark standalone cluster whose executors share
nothing with the driver (tests/helpers/spark_cluster.py): the same results as local[*], also with NATS
requiring a user and password over TLS."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from seamq.embedded import NatsServer  # noqa: E402
from seamq.nats.connect import connect  # noqa: E402
from seamq.nats.provision import apply  # noqa: E402
from seamq.settings import NatsSettings, RelaySettings, Settings  # noqa: E402
from seamq.topology import load_topology  # noqa: E402
from seamq.wiring import run_relay  # noqa: E402

from helpers import HELPERS, SEAMQ  # noqa: E402
from helpers import wait_for  # noqa: E402
from helpers.spark_cluster import CHECKOUT, SparkCluster  # noqa: E402
from helpers.pipeline import seed  # noqa: E402
from helpers.relay import events_for, unpublished, write  # noqa: E402

LOST = [5, 77, 150]  # stream sequences the broker "loses"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_executors_see_seamq_only_from_the_job(spark_cluster):
    """What runs on an executor: its own Python, seamq from the zip the driver shipped, and (as root)
    an empty checkout."""
    probe = ("import os, sys; from seamq.pipeline.spark import session, _seamq_zip\n"
             "from seamq.settings import load_settings\n"
             "spark = session(None, 'probe', settings=load_settings().pipeline)\n"
             "print('zip', _seamq_zip())\n"
             "def where(_):\n"
             "    import seamq\n"
             f"    yield (sys.executable, seamq.__file__, tuple(sorted(os.listdir({str(CHECKOUT)!r}))))\n"
             "print(sorted(set(spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect())))\n"
             "spark.stop()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    result = subprocess.run([*SEAMQ[:1], "-c", probe], env={**env, **spark_cluster.settings_env()},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    shipped = Path(next(line for line in result.stdout.splitlines() if line.startswith("zip "))[4:])
    assert shipped.name == "seamq.zip" and not shipped.parent.exists()  # the driver's zip goes with the driver
    assert {Path(python).parent for python, _, _ in seen} == {spark_cluster.python.parent}  # its own venv
    assert all(module.startswith("./seamq.zip/") or "/seamq.zip/" in module for _, module, _ in seen)
    if spark_cluster.isolated:
        assert all(listing == () for _, _, listing in seen)


async def publish_and_lose(dsn: str, nats: NatsSettings) -> set[str]:
    """300 events relayed to VIBESPRO_EVENTS, then three of them deleted from the stream."""
    topology = load_topology()
    nc = await connect(nats, persistent=False)
    js = nc.jetstream()
    await apply(js, topology)
    write(dsn, events_for(10, 30, context="vibespro"))
    stop = asyncio.Event()
    relay = asyncio.create_task(run_relay(Settings(database_url=dsn, nats=nats, relay=RelaySettings()), topology, stop))
    await wait_for(lambda: unpublished(dsn) == 0, what="published")
    stop.set()
    await relay
    lost = {(await js.get_msg("VIBESPRO_EVENTS", seq)).headers["Nats-Msg-Id"] for seq in LOST}
    for seq in LOST:
        await js.delete_msg("VIBESPRO_EVENTS", seq)
    await nc.close()
    return lost


def pipeline(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([*SEAMQ, "pipeline", *args], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def lake_ids(spark, lake: Path) -> list[tuple[str, int]]:
    return sorted((r.message_id, r.seq) for r in spark.read.parquet(str(lake)).select("message_id", "seq").collect())


def service_env(dsn: str, nats: NatsSettings, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEAMQ_", "PYSPARK_", "SPARK_"))}
    env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats.url, **extra)
    for field in ("user", "tls_ca"):
        if getattr(nats, field):
            env[f"SEAMQ_NATS__{field.upper()}"] = str(getattr(nats, field))
    if nats.password:
        env["SEAMQ_NATS__PASSWORD"] = nats.password.get_secret_value()
    return env


def local_run(spark, dsn: str, nats: NatsSettings, out: Path) -> tuple:
    """The same three jobs on the session's local[2] JVM, through the functions the commands call:
    the commands' own JVMs are the cluster side's (each JVM costs a minute of CPU on a busy CI)."""
    from seamq.pipeline.kpis import compute, summary
    from seamq.pipeline.lake import keep_following, start_lake
    from seamq.pipeline.reconcile import reconcile, report_text

    lake = out / "lake"
    keep_following(lambda: start_lake(spark, nats=nats, stream="VIBESPRO_EVENTS", lake=lake, available_now=True,
                                      checkpoint=lake / "_checkpoints" / "VIBESPRO_EVENTS"), lambda batch, rows: None)
    kpis = json.loads(json.dumps(summary(compute(spark, dsn).collect()), default=str, sort_keys=True))
    report = reconcile(spark, dsn=dsn, nats=nats, topology=load_topology(), grace=0)
    return lake_ids(spark, lake), kpis, json.loads(report_text(report))


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
async def test_lake_kpis_reconcile_on_the_cluster_equal_local(spark, spark_cluster, dsn, nats_server, tmp_path):
    nats = NatsSettings(url=nats_server.url)
    lost = await publish_and_lose(dsn, nats)
    seed(dsn)  # KPI rows with known answers beside the relayed events
    env = service_env(dsn, nats, spark_cluster.settings_env())
    out = tmp_path / "cluster"
    pipeline(["lake", "--stream", "VIBESPRO_EVENTS", "--lake", str(out / "lake"), "--available-now"], env, tmp_path)
    pipeline(["kpis", "--out", str(out / "kpis")], env, tmp_path)
    pipeline(["reconcile", "--grace", "0", "--json", str(out / "reconcile.json")], env, tmp_path)
    cluster = (lake_ids(spark, out / "lake"), json.loads((out / "kpis" / "summary.json").read_text()),
               json.loads((out / "reconcile.json").read_text()))
    assert cluster == await asyncio.to_thread(local_run, spark, dsn, nats, tmp_path / "local")
    lake, kpis, reconcile = cluster
    assert len(lake) == 297 and len({m for m, _ in lake}) == 297
    assert kpis["contexts"]["sea"]["published"] == 9990 and kpis["contexts"]["vibespro"]["outbox_total"] == 400
    assert set(reconcile["missing_from_stream"]["VIBESPRO_EVENTS"]) == lost
    assert len(reconcile["unprocessed"]["sea__from_vibespro"]) == 297  # no consumer ran


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
async def test_on_the_cluster_with_a_user_and_password_over_tls(spark, spark_cluster, dsn, tmp_path):
    tls = tmp_path / "tls"  # where the executors can read it: not in the checkout
    shutil.copytree(HELPERS / "tls", tls)
    server = NatsServer(tmp_path / "nats", user="seamq", password="s3cret-on-executors",
                        tls=(tls / "server.pem", tls / "server-key.pem"))
    server.start()
    try:
        nats = NatsSettings(url=server.url, user="seamq", password="s3cret-on-executors", tls_ca=tls / "ca.pem")
        lost = await publish_and_lose(dsn, nats)
        env = service_env(dsn, nats, spark_cluster.settings_env())
        pipeline(["lake", "--stream", "VIBESPRO_EVENTS", "--lake", str(tmp_path / "lake"), "--available-now"],
                 env, tmp_path)
        result = pipeline(["reconcile", "--grace", "0", "--json", str(tmp_path / "reconcile.json")], env, tmp_path)
    finally:
        server.kill()
    lake = lake_ids(spark, tmp_path / "lake")
    assert len(lake) == 297 and not {m for m, _ in lake} & lost
    reconcile = json.loads((tmp_path / "reconcile.json").read_text())
    assert set(reconcile["missing_from_stream"]["VIBESPRO_EVENTS"]) == lost
    assert "s3cret-on-executors" not in result.stdout + result.stderr


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_spark_submit_runs_the_pipeline_module_on_the_cluster(spark_cluster, dsn, tmp_path):
    """`spark-submit` decides the master and the executors' Python; seamq takes what it was given."""
    import seamq.pipeline.__main__ as script

    seed(dsn)
    env = service_env(dsn, NatsSettings(), {"SPARK_LOCAL_IP": "127.0.0.1"})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as in the activated environment
    submit = [str(Path(sys.prefix) / "bin" / "spark-submit"), "--master", spark_cluster.master,
              "--conf", f"spark.pyspark.python={spark_cluster.python}", "--conf", "spark.executor.memory=512m",
              "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
              "--conf", f"spark.pyspark.driver.python={sys.executable}", script.__file__,
              "kpis", "--out", str(tmp_path / "kpis")]
    result = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "kpis" / "summary.json").read_text())
    assert summary["contexts"]["sea"]["published"] == 9990 and summary["contexts"]["sea"]["breaches"]
