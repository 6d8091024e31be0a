"""`manage.py bench_chat` end to end on its own stack: logged-in sockets asking in turn, what its
user reads, and the gateway's CPU per answer (docs/benchmarks.md#fig-browser-chat-resume)."""

import re

import pytest

from tests.support.commands import manage


@pytest.mark.processes
def test_sockets_are_answered_and_the_gateways_cpu_per_answer_is_printed(child_env):
    printed = manage(
        child_env,
        "bench_chat",
        "--sockets",
        "3",
        "--questions",
        "2",
        "--max-tokens",
        "16",
        "--no-keep",
        timeout=240,
    )
    row = re.search(r"^\s+3\s+(\d+)/6\s.*\s([\d.]+)x$", printed, re.M)
    assert row is not None and row.group(1) == "6", printed
    cpu = re.search(r"gateway CPU ([\d.]+) ms per answer \(6 answers\)", printed)
    assert cpu is not None and float(cpu.group(1)) > 0, printed
