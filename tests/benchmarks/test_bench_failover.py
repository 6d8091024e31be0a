"""`manage.py bench_failover`: the scoring of what a caller got, and a quick run end to end (its
own simulators, relays, gateway and database). The run is in a subprocess, because the command
points its process's database connection at the bench database.

Verdicts of the gateway itself are the benchmark's business, not this test's: the run must score
every scenario in both modes and show what the providers saw, whatever the verdicts are today.
"""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchmarks import failover, failover_report
from benchmarks.failover_caller import Expected, Outcome, score
from tests.support.commands import manage

WHOLE = Expected(text="Once upon a time, a keeper lit the lamp.", tokens=12)
USAGE = {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}


def test_the_whole_answer_with_usage_that_adds_up_passes():
    assert score(Outcome(text=WHOLE.text, usage=USAGE), expected=WHOLE)[0] == "pass"


def test_a_truncated_answer_presented_as_complete_fails():
    verdict, got = score(Outcome(text=WHOLE.text[:14], usage=USAGE), expected=WHOLE)
    assert verdict == "fail"
    assert "truncated" in got
    assert score(Outcome(text=""), expected=WHOLE)[0] == "fail"


@pytest.mark.parametrize(
    ("outcome", "why"),
    [
        (Outcome(text=WHOLE.text), "usage missing"),
        (Outcome(text=WHOLE.text, usage={**USAGE, "completion_tokens": 5}), "5 of 12"),
        (Outcome(text=WHOLE.text, usage={**USAGE, "total_tokens": 40}), "does not add up"),
        (Outcome(text=WHOLE.text[:20] + WHOLE.text[14:], usage=USAGE), "repeated text"),
        (Outcome(text=WHOLE.text[:10] + WHOLE.text[20:], usage=USAGE), "lost text"),
    ],
)
def test_an_answer_with_a_defect_is_partial(outcome, why):
    verdict, got = score(outcome, expected=WHOLE)
    assert verdict == "partial"
    assert why in got


def test_accounting_wants_every_attempts_prompt_in_the_usage():
    expected = Expected(text=WHOLE.text, tokens=12, prompt_tokens=45)
    assert score(Outcome(text=WHOLE.text, usage=USAGE), expected=expected)[0] == "partial"
    usage = {"prompt_tokens": 45, "completion_tokens": 12, "total_tokens": 57}
    assert score(Outcome(text=WHOLE.text, usage=usage), expected=expected)[0] == "pass"


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        (Outcome(error="stream_error", text="Once", message="The model failed"), "safe"),
        (Outcome(error="connection", text="Once", message="peer closed"), "safe"),
        (Outcome(error="status", status=503, message="No model could answer"), "safe"),
        (Outcome(error="status", status=500, message="Internal Server Error"), "fail"),
        (Outcome(error="hang", text="Once"), "fail"),
    ],
)
def test_errors_are_safe_when_clean_and_fail_as_a_500_or_a_hang(outcome, verdict):
    assert score(outcome, expected=WHOLE)[0] == verdict


def test_a_content_refusal_passes_only_as_a_clean_error_with_the_providers_reason():
    with_reason = Outcome(error="status", status=400, message=f"filtered ({failover.REASON})")
    assert score(with_reason, expected=WHOLE, kind="refusal")[0] == "pass"
    without = Outcome(error="status", status=400, message="Bad request")
    assert score(without, expected=WHOLE, kind="refusal")[0] == "safe"
    answered = Outcome(text=WHOLE.text, usage=USAGE)
    assert score(answered, expected=WHOLE, kind="refusal")[0] == "partial"


def test_a_continuations_cost_is_the_callers_longest_wait_over_answers_cut_at_once():
    def row(scenario, gap, verdict="pass", prefills=2):
        return {
            "scenario": scenario,
            "verdict": verdict,
            "prefill_attempts": prefills,
            "longest_gap_s": gap,
        }

    rows = [
        row("cut-mid-stream", 0.030),
        row("no-done", 0.050),
        row("accounting", 0.040),
        row("stall", 3.1),  # its idle timeout is the detection's, not the continuation's
        row("prefill-refused", 0.9, verdict="safe"),  # not a whole answer
        row("500-once", 0.2, prefills=0),
    ]
    line = failover_report.continuation_line(rows)
    assert line == (
        "continued after a cut: the caller waited 40 ms from the last token before it to the "
        "first after (median of 3; 30–50 ms)"
    )
    assert failover_report.continuation_line(rows[3:]) is None


def test_an_unknown_scenario_is_refused_with_the_known_ones():
    with pytest.raises(CommandError, match=r"unknown scenario.*500-once"):
        call_command("bench_failover", scenarios="500-once,teapot")


@pytest.fixture(scope="module")
def quick_run(test_database_url, child_env, tmp_path_factory):
    report_path = tmp_path_factory.mktemp("bench_failover") / "report.json"
    stdout = manage(
        child_env,
        "bench_failover",
        "--quick",
        "--no-keep",
        "--json",
        str(report_path),
        timeout=280,
    )
    return stdout, json.loads(report_path.read_text())


@pytest.mark.processes
def test_a_quick_run_scores_every_scenario_in_both_modes_in_the_table_and_the_json(quick_run):
    printed, report = quick_run
    assert [(row["scenario"], row["mode"]) for row in report["rows"]] == [
        (name, mode) for name in failover.QUICK for mode in ("auto", "named")
    ]
    assert failover_report.HEADER in printed
    for row in report["rows"]:
        assert row["verdict"] in failover.VERDICTS
        assert failover_report.row_line(row) in printed
        assert row["time_s"] >= 0 and set(row["attempts"]) == {"primary", "fallback"}
    for mode in ("auto", "named"):
        counts = report["totals"][mode]
        assert sum(counts.values()) == len(failover.QUICK)
        assert f"{mode:<6} " + ", ".join(f"{counts[v]} {v}" for v in failover.VERDICTS) in printed
    assert "dropped bench_failover_" in printed


@pytest.mark.processes
def test_the_providers_side_shows_each_fault_where_it_was_injected(quick_run):
    _, report = quick_run
    rows = {(row["scenario"], row["mode"]): row for row in report["rows"]}
    for mode in ("auto", "named"):
        # The primary is asked first and answers as its fault says, whatever the gateway does next.
        first = rows[("500-once", mode)]["trace"][0]
        assert (first["provider"], first["status"]) == ("primary", 500)
        first = rows[("content-filter", mode)]["trace"][0]
        assert (first["provider"], first["status"]) == ("primary", 400)
        first = rows[("cut-mid-stream", mode)]["trace"][0]
        assert (first["provider"], first["status"], first["outcome"]) == ("primary", 200, "cut")
    # The refusal reached the caller with the provider's reason: a clean 4xx, never an answer.
    refusal = rows[("content-filter", "auto")]["caller"]
    assert refusal["error"] == "status" and 400 <= refusal["status"] < 500
