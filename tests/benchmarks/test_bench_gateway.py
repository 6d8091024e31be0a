"""`manage.py bench_gateway --quick` end to end: its own simulator, gateway and database, and what
its user reads. In a subprocess, because the command points its process's database connection
at the bench database, which this test process must keep on the test database.

Timing belongs to the benchmark, not here: the figures must be there and be numbers, whatever
they are on this machine.
"""

import json
import math

import psycopg
import pytest
from django.conf import settings

from benchmarks.gateway import case_variants
from tests.support.commands import manage
from tests.support.processes import url_with_database


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
def quick_run(test_database_url, child_env, tmp_path_factory):
    report_path = tmp_path_factory.mktemp("bench_gateway") / "report.json"
    stdout = manage(
        child_env,
        "bench_gateway",
        "--quick",
        "--no-progress",
        "--no-keep",
        "--json",
        str(report_path),
        timeout=280,
    )
    return stdout, json.loads(report_path.read_text())


@pytest.mark.processes
def test_a_quick_run_prints_every_section_and_each_target_with_its_verdict(quick_run):
    printed, report = quick_run
    for heading in (
        'the endpoint named (model "local")',
        'model "auto"',
        "KB hits against a generated long answer",
        "Two concurrent 32-token answers against one",
        "Targets",
        "load average at the start",
    ):
        assert heading in printed
    assert len(report["targets"]) == 16
    for row in report["targets"]:
        assert f"{row['target']}" in printed
    # The quick levels are 1 and 4: the targets at c=8, c=64 and c=256 did not run, and say so.
    at_levels = [
        row
        for row in report["targets"]
        if any(f"c={level}" in row["target"] for level in (8, 64, 256))
    ]
    assert at_levels and all(row["met"] is None for row in at_levels)
    others = [row for row in report["targets"] if row not in at_levels]
    assert all(isinstance(row["met"], bool) and _number(row["value"]) for row in others)
    assert "dropped bench_gateway_" in printed


@pytest.mark.processes
def test_the_sweep_compares_both_models_with_the_engine_and_every_request_completes(quick_run):
    _, report = quick_run
    for key in ("named", "auto"):
        levels = report["sweep"][key]["levels"]
        assert [row["label"] for row in levels] == ["c=1", "c=4"]
        for row in levels:
            assert row["gateway_failed"] == 0 and row["engine_failed"] == 0
            # Every answer came from the local endpoint: named, or by the rules after a KB miss.
            assert row["routes"] == {"local": 8}
            for figure in (
                "added_ttft_p50_ms",
                "added_ttft_p99_ms",
                "output_throughput_ratio",
                "gateway_cpu_ms_per_request",
                "engine_ttft_p50_ms",
                "gateway_ttft_p50_ms",
            ):
                assert _number(row[figure]), (key, row["label"], figure, row[figure])
            assert row["gateway_cpu_ms_per_request"] > 0


@pytest.mark.processes
def test_kb_questions_are_answered_by_the_kb_and_long_answers_are_generated_to_length(quick_run):
    _, report = quick_run
    first = report["first_question"]
    assert first["routes"] == {"kb": 1} and first["failed"] == 0 and _number(first["latency_ms"])
    kb = report["kb"]
    for key in ("exact", "vector"):
        assert kb[key]["routes"] == {"kb": 5} and kb[key]["failed"] == 0
        assert _number(kb[key]["p50_ms"]) and _number(kb[key]["p99_ms"])
        assert _number(kb[f"long_over_{key}"])
    assert kb["long"]["routes"] == {"local": 1} and kb["long"]["failed"] == 0
    assert kb["long"]["output_tokens_per_answer"] == 32
    pair = report["pair"]
    assert pair["failed"] == 0 and pair["rounds"][0]["output_tokens"] == 3 * 32
    assert pair["rounds"][0]["routes"] == {"local": 3}
    assert all(_number(pair[figure]) for figure in ("one_s", "two_s", "ratio"))


@pytest.mark.processes
def test_the_bench_database_is_gone_after_no_keep(quick_run):
    name = f"bench_gateway_{settings.DATABASES['default']['NAME']}"
    with psycopg.connect(
        url_with_database(settings.DATABASE_URL, "postgres"), connect_timeout=10
    ) as server:
        assert (
            server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is None
        )


def test_case_variants_are_distinct_texts_that_read_the_same_to_an_uncased_model():
    variants = case_variants(["Can I pay?", "Hi"], count=6)
    assert len(variants) == len(set(variants)) == 6
    assert variants[:2] == ["Can I pay?", "Hi"]  # the originals first, then one letter swapped each
    assert {v.lower() for v in variants} == {"can i pay?", "hi"}
    # Fewer letters than asked for: fewer texts, never a repeat.
    assert case_variants(["ab"], count=10) == ["ab", "Ab", "aB"]
