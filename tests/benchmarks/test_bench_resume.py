"""`manage.py bench_resume` end to end: its own simulator, two web processes and database, running
answers joined by reconnecting sockets, and what its user reads. The figures are in
docs/benchmarks.md#fig-resume; here every join must resume a live answer with its text so far,
and the books must add up."""

import re

import pytest

from benchmarks import resume
from tests.support.commands import manage


@pytest.mark.processes
def test_reconnects_resume_the_running_answers_on_either_web_process(child_env):
    printed = manage(
        child_env,
        "bench_resume",
        "--answers",
        "3",
        "--reconnects",
        "20",
        "--concurrency",
        "4",
        "--rounds",
        "2",
        "--idle",
        "0.5",
        "--no-keep",
        timeout=280,
    )
    # 2 rounds x 20 joins, each resuming an answer still running, with what it had said so far.
    assert "joins that resumed a live answer: 40 of 40 (40 with text so far)" in printed, printed
    assert "errors: 0" in printed
    rows = re.findall(r"^\s+\d+\s+(idle|reconnect|join)\s+(\d+)\s", printed, re.M)
    assert rows == [("idle", "0"), ("reconnect", "20"), ("join", "20")] * 2
    assert re.search(r"resuming adds: -?[\d.]+ ms of CPU per reconnect", printed)


def test_the_cost_takes_the_idle_rate_off_and_compares_round_by_round():
    phases = [
        resume.Phase(kind="idle", count=0, seconds=2.0, cpu_ms=40.0),  # 20 ms per second
        resume.Phase(kind="reconnect", count=100, seconds=0.5, cpu_ms=310.0),
        resume.Phase(kind="join", count=100, seconds=1.0, cpu_ms=420.0),
    ]

    cost = resume.resume_cost(phases)

    assert cost["idle_ms_per_s"] == 20.0
    assert cost["reconnect"] == [3.0]  # (310 - 20 x 0.5) / 100
    assert cost["join"] == [4.0]  # (420 - 20 x 1.0) / 100
    assert cost["added"] == [1.0]
