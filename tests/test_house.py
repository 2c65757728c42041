"""The test suite's own rules (issue 32): shared helpers live in tests/helpers, never in a test module."""

import re
from pathlib import Path

TESTS = Path(__file__).parent


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path.name}: {line.strip()}" for path in sorted(TESTS.rglob("*.py"))
                 for line in path.read_text().splitlines()
                 if re.match(r"\s*(from|import) (tests\.)?test_\w+", line)]
    assert not offenders, "import shared helpers from tests/helpers instead:\n" + "\n".join(offenders)


SRC = TESTS.parent / "src" / "seamq"
# The layers of docs/architecture.md, lowest first: a module imports its own layer and those below.
CORE = {"ids", "stopping", "units", "backoff", "health", "model", "envelope", "dead_letter", "holds", "verdict", "redact",
        "typed", "compat", "republish", "codec"}
JOBS_CORE = {"jobs.model", "jobs.job", "jobs.attempts", "jobs.cron", "jobs.workflows", "jobs.schemas", "jobs.admin",
             "jobs.activity"}
WORKERS = {"relay", "consumer", "handling", "metered", "dlq_replay", "dlq_desk", "jobs.operations", "jobs.job_clocks",
           "jobs.flows", "jobs.crontab", "jobs.queues", "jobs.events", "jobs.unique", "jobs.ext", "jobs.engine",
           "jobs.intake"}
DRIVERS = ("nats", "psycopg", "psycopg_pool", "sqlalchemy", "asyncpg", "aiohttp", "httptools", "seamq.nats", "seamq.pg",
           "seamq.http", "seamq.jobs.nats_store", "seamq.jobs.nats_records", "seamq.jobs.nats_ready",
           "seamq.jobs.nats_clocks", "seamq.jobs.memory_store", "seamq.wiring", "seamq.cli")


def _imports(module: str) -> set[str]:
    """What a module imports when it runs (imports inside `if TYPE_CHECKING:` are types only)."""
    import ast

    tree = ast.parse((SRC / (module.replace(".", "/") + ".py")).read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{alias.name}" if node.module == "seamq" or node.module == "seamq.jobs"
                      else node.module for alias in node.names}
    return found


def test_the_core_imports_nothing_above_it():
    allowed = {f"seamq.{m}" for m in CORE}
    upward = {m: sorted(i for i in _imports(m) if i.startswith("seamq") and i not in allowed) for m in CORE}
    assert not {m: i for m, i in upward.items() if i}


def test_the_jobs_core_imports_only_the_core():
    allowed = {f"seamq.{m}" for m in CORE | JOBS_CORE}
    upward = {m: sorted(i for i in _imports(m) if i.startswith("seamq") and i not in allowed) for m in JOBS_CORE}
    assert not {m: i for m, i in upward.items() if i}


def test_workers_see_ports_never_a_driver():
    drivers = {m: sorted(i for i in _imports(m) if i.split(".")[0] in DRIVERS or i.startswith(DRIVERS))
               for m in WORKERS}
    assert not {m: i for m, i in drivers.items() if i}
