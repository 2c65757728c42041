"""The test suite's own rules (issue 32): shared helpers live in tests/helpers, never in a test module."""

import re
from pathlib import Path

TESTS = Path(__file__).parent


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path.name}: {line.strip()}" for path in sorted(TESTS.rglob("*.py"))
                 for line in path.read_text().splitlines()
                 if re.match(r"\s*(from|import) (tests\.)?test_\w+", line)]
    assert not offenders, "import shared helpers from tests/helpers instead:\n" + "\n".join(offenders)
