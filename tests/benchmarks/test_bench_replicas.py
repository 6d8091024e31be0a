"""`manage.py bench_replicas` end to end, small: both modes run against three simulators through the
gateway, every request completes, and the table says who served what. In a subprocess, as the
command points its database connection at a bench database of its own."""

import re
import subprocess
import sys

import pytest

from tests.support.commands import manage
from tests.support.processes import BASE_DIR

pytestmark = pytest.mark.processes  # the command starts simulators, a gateway and its database


def test_a_small_run_compares_both_modes_and_every_request_completes(child_env):
    stdout = manage(
        child_env,
        "bench_replicas",
        "--rounds",
        "1",
        "--requests",
        "12",
        "--concurrency",
        "4",
        "--max-tokens",
        "4",
        timeout=280,
    )
    rows = {
        m.group(1): m
        for m in re.finditer(
            (
                r"^(least_busy|round_robin) +([\d.]+) +([\d.]+) +(\d+) +(\d+)"
                r"  (\d+)% / (\d+)% / (\d+)%$"
            ),
            stdout,
            re.M,
        )
    }
    assert set(rows) == {"least_busy", "round_robin"}, stdout
    for row in rows.values():
        assert row.group(5) == "0" and sum(int(row.group(n)) for n in (6, 7, 8)) in (99, 100, 101)
    assert "dropped bench_replicas_" in stdout


def test_an_unknown_mode_is_refused_before_anything_starts(child_env):
    done = subprocess.run(
        [sys.executable, "manage.py", "bench_replicas", "--modes", "least_busy,fastest"],
        cwd=BASE_DIR,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        done.returncode != 0
        and "--modes: choose from least_busy, round_robin, queue_only" in done.stderr
    )
