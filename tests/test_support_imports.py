"""What tests share lives in tests/support/ (CONTRIBUTING, "Tests"), where a reader looks for it,
not in a conftest.py, which pytest reads for its folder's fixtures: no test module imports from a
conftest. Fixtures stay in conftest files."""

import ast
from pathlib import Path

from tests.support.source import parse

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_from_a_conftest():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(alias.name for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if any(name.rpartition(".")[2] == "conftest" for name in names):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert not found, found
