"""`manage.py bench_fairness` end to end, small, against the simulator: with admission and at the
engine's floor (no gateway), the quiet tenant's questions are answered, the noisy tenant's
requests all complete, and the summary compares the two. In a subprocess, as the command points
its database connection at a bench database of its own."""

import re
import subprocess
import sys

import pytest

from tests.support.commands import manage
from tests.support.processes import BASE_DIR

pytestmark = pytest.mark.processes  # the command starts the simulator, a gateway and a database


def test_a_small_run_measures_admission_beside_the_engines_floor(child_env):
    stdout = manage(
        child_env,
        "bench_fairness",
        *("--streams", "4", "--max-num-seqs", "2", "--capacity", "2", "--processes", "1"),
        *("--seconds", "3", "--warmup", "1", "--long-tokens", "8", "--short-tokens", "2"),
        *("--ttft", "5", "--itl", "5", "--deadline", "60", "--modes", "on,floor"),
        timeout=280,
    )
    assert "capacity with admission 2 (reserve 1, API deadline 60 s)" in stdout, stdout
    for mode in ("on", "floor"):
        line = re.search(
            rf"^  {mode}: quiet TTFT p50 \d+ ms.*\((\d+) questions, 0 failed\)", stdout, re.M
        )
        assert line and int(line.group(1)) > 0, stdout
        noisy = re.search(
            rf"^  {mode}: .*noisy: (\d+) started, (\d+) completed, failed: none$", stdout, re.M
        )
        assert noisy and noisy.group(1) == noisy.group(2) != "0", stdout
    assert re.search(r"^quiet p99 with admission / the engine's floor: [\d.]+x$", stdout, re.M)


def test_a_capacity_below_one_is_refused_before_anything_starts(child_env):
    done = subprocess.run(
        [sys.executable, "manage.py", "bench_fairness", "--capacity", "0"],
        cwd=BASE_DIR,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "--capacity" in done.stderr and "must be > 0" in done.stderr
