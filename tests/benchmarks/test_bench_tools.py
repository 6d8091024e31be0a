"""`manage.py bench_tools` end to end: its own simulator (with its tool parser), gateway and
database, tool-call streams against text streams of the same length, and what its user reads. The
figures are in docs/benchmarks.md#fig-tool-calls; here every stream must deliver what it asked
for, and the books must add up."""

import json
import math
import re

import pytest

from benchmarks import tools
from tests.support.commands import manage


@pytest.mark.processes
def test_a_quick_run_compares_tool_calls_with_text_of_the_same_length(child_env, tmp_path):
    report_path = tmp_path / "tools.json"
    printed = manage(
        child_env, "bench_tools", "--quick", "--no-keep", "--json", str(report_path), timeout=280
    )

    call = re.search(r"a call of (\d+) completion tokens \(3 calls: (\d+)–(\d+)\)", printed)
    assert call, printed
    tokens = int(call.group(1))
    assert tokens > 100 and call.group(2) == call.group(3) == str(tokens)  # one known length
    assert f"text answers of {tokens} tokens (max_tokens {tokens}, ignore_eos)" in printed
    # 2 rounds at c=4, in ABBA order, 8 streams per phase, none failed.
    rows = re.findall(r"^\s+(\d)\s+4\s+(text|tool)\s+8\s+(\d+)\s", printed, re.M)
    assert rows == [
        ("1", "text", "0"),
        ("1", "tool", "0"),
        ("2", "tool", "0"),
        ("2", "text", "0"),
    ], printed
    assert re.search(r"c=4: gateway CPU per request text [\d.]+ ms .*tool/text [\d.]+×", printed)
    assert re.search(r"c=4: [\d.]+× \([\d.]+–[\d.]+\): (met|MISSED)", printed)
    assert "failed requests: 0 of 32: met" in printed

    report = json.loads(report_path.read_text())
    assert report["completion_tokens"] == tokens
    level = report["levels"]["4"]
    assert level["failed"] == 0 and level["requests"] == 32
    assert math.isfinite(level["ratio"]["median"]) and level["ratio"]["median"] > 0
    for phase in report["phases"]:
        assert phase["failed"] == 0 and phase["cpu_ms"] > 0
        # Every stream as long as the call: the text by ignore_eos, the call by the seed.
        assert phase["completion_tokens"] == [tokens, tokens]
    # A call streams fewer chunks than its tokens (nothing until the name is whole, nor for the
    # closing tags); the text at most one per token: the engine sends one per token, but under
    # load one network read can hold several, and the relay passes a read on as one chunk.
    chunks = {p["kind"]: p["chunks_per_request"] for p in report["phases"]}
    assert 0 < chunks["text"] <= tokens and chunks["tool"] < tokens


def _phase(kind: str, round_number: int, cpu_ms: float, seconds: float = 2.0) -> tools.Phase:
    return tools.Phase(
        kind=kind,
        concurrency=16,
        round=round_number,
        requests=10,
        seconds=seconds,
        cpu_ms=cpu_ms,
        ttfts=[0.1, 0.2, 0.3],
        tokens=[200] * 10,
    )


def test_the_ratio_is_taken_round_by_round_and_given_with_its_range():
    phases = [
        _phase("text", 1, 200.0),  # 20 ms per request
        _phase("tool", 1, 220.0),  # 22: 1.10x
        _phase("tool", 2, 180.0),  # 18
        _phase("text", 2, 200.0),  # 0.90x
        _phase("text", 3, 100.0),  # 10
        _phase("tool", 3, 130.0, seconds=4.0),  # 13: 1.30x
    ]

    summary = tools.level_summary(phases)

    assert summary["rounds"] == 3
    assert summary["ratios"] == pytest.approx([1.1, 0.9, 1.3])
    assert summary["ratio"]["median"] == pytest.approx(1.1)
    assert (summary["ratio"]["min"], summary["ratio"]["max"]) == pytest.approx((0.9, 1.3))
    assert summary["text_cpu_ms"]["median"] == 20.0
    assert summary["tool_cpu_ms"] == pytest.approx({"median": 18.0, "min": 13.0, "max": 22.0})
    assert summary["ttft_p50_ms"]["tool"]["median"] == pytest.approx(200.0)
    assert summary["output_tokens_per_s"]["tool"]["min"] == 500.0  # 2,000 tokens in 4 s
    assert summary["makespan_s"]["tool"]["max"] == 4.0
    assert tools.target_met(summary)  # 1.1x is within the target, not over it
    summary["ratio"]["median"] = 1.11
    assert not tools.target_met(summary)


def test_the_phases_alternate_in_abba_order():
    assert [tools.order(n) for n in (1, 2, 3, 4)] == [
        ("text", "tool"),
        ("tool", "text"),
        ("text", "tool"),
        ("tool", "text"),
    ]


def test_a_stream_counts_only_when_it_delivers_what_was_asked():
    def call(arguments: str, name: str = tools.TOOL_NAME) -> tools.Outcome:
        return tools.Outcome(tokens=200, calls={0: {"name": name, "arguments": arguments}})

    valid = {
        "title": "the order page fails",
        "summary": "s",
        "product": "p",
        "severity": "high",
        "priority": 2,
        "steps": ["a", "b", "c", "d"],
        "customer": {"name": "n", "email": "user@example.com", "account": 1234},
    }
    assert tools.delivered(call(json.dumps(valid)), kind="tool", tokens=0) is None
    assert tools.delivered(call(json.dumps(valid), name="other"), kind="tool", tokens=0) == (
        "no_call"
    )
    assert tools.delivered(call(json.dumps(valid)[:-5]), kind="tool", tokens=0) == (
        "arguments_not_json"
    )
    assert tools.delivered(call(json.dumps({**valid, "priority": 9})), kind="tool", tokens=0) == (
        "arguments_invalid"
    )
    assert tools.delivered(tools.Outcome(tokens=200, text=["hi"]), kind="tool", tokens=0) == (
        "no_call"
    )

    assert tools.delivered(tools.Outcome(tokens=200, text=["hi"]), kind="text", tokens=200) is None
    assert tools.delivered(tools.Outcome(tokens=150, text=["hi"]), kind="text", tokens=200) == (
        "text_of_150_tokens"
    )
    assert tools.delivered(tools.Outcome(error="timeout"), kind="text", tokens=200) == "timeout"
