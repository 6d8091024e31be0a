"""`manage.py bench_inprocess` end to end with tiny sizes: the real vLLM server it starts and the
in-process side under the engine venv's python, and what its user reads.

Timing belongs to the benchmark, not here: the figures must be there and be numbers, whatever
they are on this machine. No test here touches the database.
"""

import io
import json
import math

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference_ops.engine_processes import session_processes

pytestmark = pytest.mark.engines

TOKENS = 8


def _number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    report_path = tmp_path_factory.mktemp("bench_inprocess") / "report.json"
    out = io.StringIO()
    call_command(
        "bench_inprocess",
        "--tokens",
        str(TOKENS),
        "--rounds",
        "1",
        "--json",
        str(report_path),
        stdout=out,
    )
    return out.getvalue(), json.loads(report_path.read_text())


@pytest.mark.timeout(900)
def test_a_tiny_run_prints_both_sides_and_the_ratios(tiny_run):
    printed, report = tiny_run
    assert "load average" in printed and "at the start" in printed
    assert "torch threads 1 (--threads)" in printed
    for line in (
        "before: in-process generate() under a lock",
        "after:  vLLM server over HTTP",
        "before / after",
    ):
        assert line in printed
    figures = report["summary"]
    for side in ("before", "after"):
        assert all(_number(figures[side][key]) for key in ("one_s", "two_s", "two_over_one"))
        assert f"{figures[side]['two_over_one']:.2f}x" in printed
    assert _number(figures["one_before_over_after"]) and _number(figures["two_before_over_after"])
    assert f"{figures['one_before_over_after']:.2f}x" in printed
    assert f"{figures['two_before_over_after']:.2f}x" in printed


@pytest.mark.timeout(900)
def test_both_sides_answer_the_same_prompts_with_every_token_asked(tiny_run):
    printed, report = tiny_run
    (round_,) = report["rounds"]
    assert round_["order"] == ["before", "after"]
    before, after = round_["before"], round_["after"]
    # One answer alone, then two at once, on each side.
    assert len(before["answers"]) == len(after["answers"]) == 3
    assert all(answer["output_tokens"] == TOKENS for answer in before["answers"] + after["answers"])
    assert [a["prompt_tokens"] for a in before["answers"]] == [
        a["prompt_tokens"] for a in after["answers"]
    ]
    assert "prompt tokens differ" not in printed
    assert before["torch_threads"] == 1 and before["torch"].startswith("2.")


@pytest.mark.timeout(900)
def test_the_vllm_server_it_started_is_gone_when_it_ends(tiny_run):
    _, report = tiny_run
    assert session_processes(report["vllm"]["pid"]) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tokens", "0"], "must be at least 1"),
        (["--rounds", "0"], "must be at least 1"),
        (["--tokens", "4000"], "does not fit"),
        (["--threads", "999"], "more than this machine's"),
        (["--timeout", "0"], "must be above 0"),
    ],
)
def test_a_bad_flag_is_refused_before_anything_starts(flags, message):
    with pytest.raises(CommandError, match=message):
        call_command("bench_inprocess", *flags, stdout=io.StringIO())
