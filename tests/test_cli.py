"""The command line's contract: coded errors instead of tracebacks, documented exit codes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from seamq.cli.common import INPUT_ERRORS
from seamq.model import ErrorCode

from conftest import SEAMQ

README = (Path(__file__).parent.parent / "README.md").read_text()


def seamq(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    return subprocess.run([*SEAMQ, *args], env={**clean, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["db", "status"], ["db", "upgrade"], ["dlq", "list"], ["dlq", "purge", "--yes"],
                                     ["pipeline", "kpis"], ["pipeline", "reconcile"], ["backlog"]])
def test_no_database_configured_is_a_coded_error_not_a_traceback(command):
    result = seamq(*command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith("error[INVALID_CONFIG]: no database configured: set SEAMQ_DATABASE_URL")
    assert "Traceback" not in result.stderr and "log4j" not in result.stderr  # said before a JVM starts


def test_an_unreachable_database_names_itself_without_the_password():
    result = seamq("db", "status", SEAMQ_DATABASE_URL=f"postgresql://app:hunter2-secret@127.0.0.1:{_closed_port()}/x")
    assert result.returncode == 1 and "error[DATABASE_UNAVAILABLE]" in result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_version():
    from importlib.metadata import version

    result = seamq("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"seamq {version('seamq')}"


def test_every_error_code_is_documented_with_its_exit_code():
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d) \|", README, re.M))
    assert set(documented) == {code.value for code in ErrorCode}
    for code in ErrorCode:
        assert int(documented[code.value]) == (2 if code in INPUT_ERRORS else 1), code


def _closed_port() -> int:
    from seamq.dev.embedded import free_port

    return free_port()


def test_the_documented_registry_import_works_from_the_project_folder(tmp_path):
    """`seamq consume --registry registry_generated:REGISTRY`, run where `seamq registry generate`
    wrote the module, finds it without PYTHONPATH (the installed `seamq` script, not `python -m`)."""
    import sys

    (tmp_path / "registry_generated.py").write_text(
        "from seamq.registry import Registry\nREGISTRY = Registry(default='http://127.0.0.1:9/handle')\n")
    script = Path(sys.executable).parent / "seamq"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_") and k != "PYTHONPATH"}
    result = subprocess.run([str(script), "consume", "--consumer", "sea__from_vibespro", "--registry",
                             "registry_generated:REGISTRY"], cwd=tmp_path, env=clean, capture_output=True, text=True,
                            timeout=120)
    # Past the registry: what stops it now is the next thing it needs.
    assert "error[INVALID_CONFIG]: no database configured" in result.stderr, result.stderr
