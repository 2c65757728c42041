"""Real services for every test: nats-server (or a cluster of three) and PostgreSQL on free ports in temp dirs.

PostgreSQL starts once per session (fsync off: tests, not data), from
seamq.testing, the plugin users get; each test gets its own database cloned
from a migrated template, so tests never see each other's rows. nats-server is cheap (~60 ms), so each test gets its own,
which also lets a test stop, restart or kill it. Everything is stopped and
removed at the end, also when a test fails.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from seamq.embedded import NatsCluster, NatsServer
from seamq.nats.connect import connect
from seamq.nats.provision import apply
from seamq.settings import NatsSettings
from seamq.topology import load_topology

from helpers import FAST_TOPOLOGY, spark_scratch
from helpers.handler_service import HandlerService

# The users' pytest plugin provides PostgreSQL: a session server and a migrated database per test.
pytest_plugins = ["seamq.testing", "helpers.engines"]  # helpers.engines: the engine's unit tests' two servers


# Each test's tier is the first folder under tests/ (tests/<tier>/<part>/test_*.py), and becomes its
# mark (pyproject.toml): `pytest -m unit` runs the unit tier in seconds, `-m "not spark and not
# cluster"` what needs only one nats-server and PostgreSQL. A unit test that asks for a real service
# is a mistake this hook reports, so the tier cannot drift.
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "contracts", "integration", "cluster", "spark", "soak")
SERVICES = {"dsn", "empty_dsn", "pg_server", "nats_server", "nats_cluster", "nats_settings", "nc", "provisioned",
            "topo", "publish_path", "service", "service_env", "spark", "seamq_database", "seamq_postgres",
            "seamq_nats", "seamq_topology"}


# `make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`): each test goes to
# whichever worker is free, except these modules, whose tests share one costly service (a module
# fixture, or the session's Spark JVM) and so stay together on one worker, in order; and the tests
# of `seamq dev`, which takes the well-known ports 8080 and 8090 when they are free and checks that
# it gave them back, so that no other `seamq dev` may hold them meanwhile. The grouping is our own
# scheduler's (pytest_xdist_make_scheduler below), by module: xdist's `xdist_group` mark works by
# rewriting a test's node id, which pytest 9.2 no longer lets a plugin do, and then groups nothing.
TOGETHER = {"test_pipeline_cluster": "spark-cluster", "test_pipeline_kpis": "spark", "test_pipeline_lake": "spark",
            "test_pipeline_source": "spark", "test_pipeline_reconcile": "spark", "test_console": "console",
            "test_jobs_admin_ui": "admin-ui", "test_jobs_sdk_js": "sdk-js", "test_jobs_sdk_python": "sdk-py",
            "test_dev": "seamq-dev", "test_first_app": "seamq-dev"}


def _tier(item) -> str:
    tier = item.path.resolve().relative_to(TESTS).parts[0]
    assert tier in TIERS, f"{item.nodeid}: tests live in tests/<tier>/<part>/, the tier one of {TIERS}"
    used = SERVICES & set(item.fixturenames)
    assert tier != "unit" or not used, f"{item.nodeid} is in the unit tier but asks for {sorted(used)}"
    return tier


# The longest tests and groups, started first so that none of them is left running alone at the end
# (longest first: each takes one to six minutes on a busy 2-core machine, where the rest take seconds).
FIRST = ("test_pipeline_cluster.py", "test_pipeline_lake.py", "test_pipeline_kpis.py", "test_pipeline_source.py",
         "test_pipeline_reconcile.py", "test_bench.py::test_quick_bench", "cron-overlap-prevention",
         "cron-fires-on-schedule", "test_secrets.py::test_no_secret_in_any_error_path", "within_10s",
         "test_jobs_cluster.py", "test_jobs_restart.py")


def _rank(item) -> int:
    return next((i for i, mark in enumerate(FIRST) if mark in item.nodeid), len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    for item in items:
        tier = _tier(item)
        item.add_marker(getattr(pytest.mark, tier))
        if tier != "spark" and "spark" in item.fixturenames:
            item.add_marker(pytest.mark.spark)  # the Spark cluster's tests are both


def group_of(nodeid: str) -> str:
    """The unit of work a worker takes whole: a TOGETHER module's group, else the test alone."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return TOGETHER.get(module, nodeid)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Together(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return Together(config, log)


# The controller checks that each group ran on one worker: a scheduler that stops grouping (as
# xdist's own did on pytest 9.2, silently: four Spark clusters at once on two cores) fails the run.
RAN_ON: dict[str, set[str]] = {}


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker that ran it
    group = group_of(report.nodeid)
    if node is not None and group != report.nodeid:
        RAN_ON.setdefault(group, set()).add(node.gateway.id)


def _split() -> dict[str, list[str]]:
    return {group: sorted(workers) for group, workers in RAN_ON.items() if len(workers) > 1}


def pytest_sessionfinish(session):
    if _split():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _split():
        terminalreporter.write_line(f"error: test groups ran on several workers: {_split()}", red=True)


@pytest.fixture(scope="session")
def pg_server(seamq_postgres):
    return seamq_postgres


@pytest.fixture
def dsn(seamq_database):
    """A migrated database of this test's own."""
    return seamq_database


@pytest.fixture(params=["memory", "postgres"])
def database(request) -> str | None:
    """A port's contract suite runs each case twice: on the in-memory implementation (None) and on
    PostgreSQL (a migrated database's DSN)."""
    return request.getfixturevalue("dsn") if request.param == "postgres" else None


@pytest.fixture
def empty_dsn(pg_server):
    """A database with no schema yet, for migration tests."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def nats_cluster(tmp_path):
    """Three clustered nats-servers with JetStream, for R3 streams and node-loss tests."""
    cluster = NatsCluster(tmp_path / "cluster", 3)
    cluster.start()
    yield cluster
    cluster.kill()


@pytest.fixture
def nats_settings(nats_server) -> NatsSettings:
    return NatsSettings(url=nats_server.url)


@pytest.fixture
async def nc(nats_settings):
    client = await connect(nats_settings, name="seamq-test")
    yield client
    await client.close()


@pytest.fixture
def topology():
    return load_topology()


@pytest.fixture
async def provisioned(nc, topology):
    await apply(nc.jetstream(), topology)
    return topology


@pytest.fixture(params=["fast_batch", "pipelined"])
async def publish_path(request, nc, provisioned):
    """The relay's two ways to publish: "pipelined" is a stream without allow_batched, as on a
    server older than 2.14 or a stream provisioned before seamq used fast batches."""
    if request.param == "pipelined":
        js = nc.jetstream()
        for context in provisioned.contexts.values():
            config = (await js.stream_info(context.stream.name)).config
            config.allow_batched = False
            await js.update_stream(config)
    return request.param


@pytest.fixture
def service_env(dsn, nats_server):
    """Environment for running `seamq ...` in a subprocess against this test's services (and without
    the developer's PGAPPNAME: workers name their sessions themselves, and tests find them by it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_") and k != "PGAPPNAME"}
    env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats_server.url, PYTHONUNBUFFERED="1")
    return env




@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One Spark local[2] session for the pipeline tests (the JVM takes seconds to start). Its
    scratch goes to a pytest folder: this JVM does not get to clean /tmp when pytest ends."""
    from seamq.pipeline.spark import session
    from seamq.settings import PipelineSettings

    spark = session("local[2]", app="seamq-tests",
                    settings=PipelineSettings(conf=spark_scratch(tmp_path_factory.mktemp("spark-scratch"))))
    yield spark
    spark.stop()




@pytest.fixture
async def topo(tmp_path, nc):
    """The fast topology, provisioned on this test's nats-server."""
    path = tmp_path / "topology.yaml"
    path.write_text(FAST_TOPOLOGY)
    topology = load_topology(path)
    await apply(nc.jetstream(), topology)
    return topology


@pytest.fixture
def service():
    """A real FastAPI handler service (uvicorn, free port) whose answers the test scripts."""
    with HandlerService() as svc:
        yield svc
