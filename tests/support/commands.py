"""A management command run as its user runs it: `manage.py …` in a process of its own, with the
test run's environment (`child_env`)."""

import subprocess
import sys

from django.conf import settings


def manage(child_env: dict[str, str], *args: str, timeout: float) -> str:
    """What `manage.py *args` printed; the test fails with both of its outputs unless it
    succeeded."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    return done.stdout
