"""The house's rules that reading the files can check: where tests and helpers live, the layers of
src/ and their imports, one list of job states, no file over 400 lines."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[3] / "tests"


TIERS = ("unit", "contracts", "integration", "cluster", "spark", "soak")  # tests/conftest.py marks each by its folder
PARTS = ("messaging", "jobs", "console", "pipeline", "product")


def test_tests_are_laid_out_as_the_house_is_and_helpers_live_in_tests_helpers():
    """tests/<tier>/<part>/test_*.py; anything else a test imports (harnesses, handlers, the files
    they read) under tests/helpers; tests/conftest.py for the fixtures every tier shares (issue 48)."""
    misplaced = []
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(TESTS).parts
        if where[0] == "helpers" or where == ("conftest.py",):
            continue
        if not (len(where) == 3 and where[0] in TIERS and where[1] in PARTS and where[2].startswith("test_")):
            misplaced.append("/".join(where))
    assert not misplaced, misplaced


def test_tests_and_the_bench_import_neither_each_other():
    """The bench measures and the tests check: what both need (services, a job server) is seamq's
    own (seamq.embedded), so that neither breaks when the other is laid out anew."""
    bench = TESTS.parent / "bench"
    found = [f"{p.relative_to(TESTS.parent)}: {line.strip()}"
             for folder, other in ((TESTS, "bench"), (bench, "tests")) for p in sorted(folder.rglob("*.py"))
             for line in p.read_text().splitlines() if re.match(rf"\s*(from|import) {other}\b", line)]
    assert not found, found


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path.name}: {line.strip()}" for path in sorted(TESTS.rglob("*.py"))
                 for line in path.read_text().splitlines()
                 if re.match(r"\s*(from|import) (tests\.)?test_\w+", line)]
    assert not offenders, "import shared helpers from tests/helpers instead:\n" + "\n".join(offenders)


SRC = TESTS.parent / "src" / "seamq"
# The layers of docs/architecture.md, lowest first: a module imports its own layer and those below.
CORE = {"ids", "stopping", "units", "backoff", "health", "model", "envelope", "dead_letter", "holds", "verdict", "redact",
        "typed", "compat", "republish", "codec", "tables"}
JOBS_CORE = {"jobs.model", "jobs.job", "jobs.attempts", "jobs.cron", "jobs.workflows", "jobs.schemas", "jobs.admin",
             "jobs.activity", "jobs.tally", "jobs.checkpoints", "jobs.webhooks", "jobs.backpressure",
             "jobs.limits", "jobs.tenants", "jobs.pools", "jobs.sealing"}
WORKERS = {"relay", "consumer", "handling", "metered", "dlq_replay", "dlq_desk", "jobs.operations", "jobs.completions", "jobs.admission",
           "jobs.beats", "jobs.flows", "jobs.crontab", "jobs.queues", "jobs.events", "jobs.unique", "jobs.ext", "jobs.engine",
           "jobs.intake", "jobs.tallied", "jobs.recounts", "jobs.hooks", "jobs.limiter", "tables_desk"}
DRIVERS = ("nats", "psycopg", "psycopg_pool", "sqlalchemy", "asyncpg", "aiohttp", "httptools", "seamq.nats", "seamq.pg",
           "seamq.http", "seamq.jobs.nats_store", "seamq.jobs.nats_records", "seamq.jobs.nats_ready",
           "seamq.jobs.nats_clocks", "seamq.jobs.memory_store", "seamq.memory_dead_letters", "seamq.memory_outbox", "seamq.wiring", "seamq.cli")


def _imports(module: str, *, types: bool = False) -> set[str]:
    """What a module imports when it runs (imports inside `if TYPE_CHECKING:` are types only, and
    counted with `types`)."""
    import ast

    tree = ast.parse((SRC / (module.replace(".", "/") + ".py")).read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only and not types:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}") else node.module
                      for alias in node.names}
    return found


def _is_module(name: str) -> bool:
    return name.startswith("seamq.") and (SRC / name.removeprefix("seamq.").replace(".", "/")).with_suffix(".py").exists()


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


# Every module of src/ in one layer of docs/architecture.md, lowest first; a new module must be placed.
SHARED = {"topology", "settings", "observability", "registry"}  # read by every layer: configuration, logs
PORTS = {"ports", "jobs.ports"}
ADAPTERS = ("nats.", "pg.", "http.", "embedded.", "pipeline.", "jobs.nats_")
ADAPTER_MODULES = {"memory", "memory_dead_letters", "memory_outbox", "inprocess", "outbox", "jobs.memory_store", "jobs.transactional", "jobs.route", "jobs.client", "jobs.poster"}
MORE_WORKERS = {"audit", "jobs.worker", "jobs.handlers", "jobs.durable"}
FACES = ("cli.", "console.", "dev.")
FACE_MODULES = {"__main__", "wiring", "doors", "testing", "asyncapi", "jobs.native", "jobs.app", "jobs.api", "jobs.auth",
                "jobs.routes", "jobs.probe_routes", "jobs.hook_routes", "jobs.fair_routes", "jobs.admin_routes", "jobs.console_routes", "jobs.ext_routes", "jobs.serve"}
LAYERS = ("core", "ports", "adapters", "workers", "faces")


def _layer(module: str) -> str | None:
    if module in CORE | JOBS_CORE | SHARED:
        return "core"
    if module in PORTS:
        return "ports"
    if module.startswith(ADAPTERS) or module in ADAPTER_MODULES:
        return "adapters"
    if module in WORKERS | MORE_WORKERS:
        return "workers"
    if module.startswith(FACES) or module in FACE_MODULES:
        return "faces"
    return None


def _modules() -> list[str]:
    return sorted(p.relative_to(SRC).with_suffix("").as_posix().replace("/", ".")
                  for p in SRC.rglob("*.py") if p.stem != "__init__")


def test_every_module_imports_only_its_layer_and_those_below():
    modules = _modules()
    assert not [m for m in modules if _layer(m) is None], "place each module in a layer (tests/unit/product/test_house.py)"
    rank = {m: LAYERS.index(_layer(m)) for m in modules}
    upward = sorted(f"{m} ({_layer(m)}) imports {t} ({_layer(t)})" for m in modules for i in _imports(m)
                    if (t := i.removeprefix("seamq.")) in rank and rank[t] > rank[m])
    assert not upward, upward


def test_the_cli_and_the_console_open_no_driver_and_write_no_sql():
    """They go through one door, seamq.doors, which opens the repositories and readers of pg/ and
    nats/ that a person's work needs (issue 48)."""
    driver = re.compile(r"^\s*(import|from) (psycopg|psycopg_pool|nats|seamq\.pg|seamq\.nats)\b|"
                        r"^\s*from seamq import (pg|nats)\b|\b(SELECT|INSERT INTO|UPDATE|DELETE FROM) ")
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted([*(SRC / "cli").rglob("*.py"), *(SRC / "console").rglob("*.py")])
             for n, line in enumerate(p.read_text().splitlines(), 1) if driver.search(line)]
    assert not found, found


def test_no_import_cycle_anywhere():
    """A module that needs another's methods names them (a Protocol) rather than importing a module
    that imports it back, even for types: such a pair can only change together. (Packages'
    __init__ files, which gather their modules' names, are left out.)"""
    modules = _modules()
    needs = {m: {i.removeprefix("seamq.") for i in _imports(m, types=True)} & set(modules) for m in modules}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen)) for n in needs[start])
    cycles = sorted(m for m in modules if reaches(m, m, set()))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_a_job_state_is_written_once():
    """The seven states are seamq.jobs.model.State; a second list of them drifts (it did: a tuple in
    model, an enum in job)."""
    import ast

    names = {"scheduled", "available", "active", "retryable", "completed", "discarded", "cancelled"}
    offenders = []
    for path in sorted((SRC / "jobs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            values = [getattr(e, "value", None) for e in getattr(node, "elts", [])] if isinstance(
                node, (ast.Tuple, ast.List, ast.Set)) else [getattr(getattr(b, "value", None), "value", None)
                                                           for b in node.body] if isinstance(node, ast.ClassDef) else []
            if len(names & {v for v in values if isinstance(v, str)}) >= 3 and not (
                    path.name == "model.py" and getattr(node, "name", "") == "State"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"job states written again: {offenders}"


def test_no_class_is_put_together_from_mixins():
    """A class made of classes of seamq's own (the job store was `NatsJobStore(Records, ReadyOrder,
    Clocks)`, each calling the others' methods through `self`) is one class split by size: its
    parts go in through its constructor instead (issue 46). Bases from outside seamq (`str, Enum`, a
    library's interfaces) are not counted."""
    import ast

    ours = {node.name for p in SRC.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.ClassDef)}
    found = [f"{p.relative_to(SRC)}: {node.name}" for p in sorted(SRC.rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef)
             and len([b for b in node.bases if ast.unparse(b).rsplit(".", 1)[-1] in ours]) > 1]
    assert not found, found


def test_no_file_of_the_product_over_400_lines():
    """A file that grows past 400 lines holds more than one idea: split it by idea, not by size."""
    root = TESTS.parent
    long = {str(p.relative_to(root)): n for p in sorted([*SRC.rglob("*.py"), *(root / "bench").rglob("*.py")])
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_no_module_of_seamq_goes_by_one_letter():
    """`J.claimed(...)` said less than the name it hid (review of 3e034a3): a module of seamq is
    imported under its own name or one that says what it holds (`moves`), or its names by name."""
    found = [f"{p.relative_to(SRC)}: {line.strip()}" for p in sorted(SRC.rglob("*.py"))
             for line in p.read_text().splitlines() if re.match(r"\s*(from seamq\S* )?import seamq?\S* as \w\b", line)
             or re.match(r"\s*from seamq\S* import \w+ as \w\b", line)]
    assert not found, found

