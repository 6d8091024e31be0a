"""`manage.py bench` against the vLLM simulator over real HTTP: what its user reads.

pytest-django refuses database access in these tests (none is marked django_db), so they
also show that the command needs no database.
"""

import io
import json

import pytest
from django.core.management import call_command

from tests.inference_ops.simulator_process import start_simulator

INJECTED_KINDS = {
    "connection_error",
    "timeout",
    "stream_error:InternalServerError",
    "http_429:RateLimitError",
    "http_500:InternalServerError",
}


@pytest.fixture(scope="module")
def fast():
    sim = start_simulator(
        "serve",
        "acme/bench",
        "--time-to-first-token",
        "20",
        "--inter-token-latency",
        "2",
        "--seed",
        "1",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def slow():
    sim = start_simulator(
        "serve",
        "acme/slow",
        "--time-to-first-token",
        "40",
        "--inter-token-latency",
        "2",
        "--seed",
        "2",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def faulty():
    sim = start_simulator(
        "serve",
        "acme/faulty",
        "--time-to-first-token",
        "20",
        "--inter-token-latency",
        "2",
        "--failure-injection-rate",
        "1",
        "--seed",
        "3",
    )
    yield sim
    sim.stop()


def bench(*args: str) -> str:
    out = io.StringIO()
    call_command("bench", *args, "--no-progress", "--cooldown", "0", stdout=out)
    return out.getvalue()


def test_it_measures_two_levels_and_compares_two_urls_round_by_round(fast, slow, tmp_path):
    report_path, plot_path = tmp_path / "out.json", tmp_path / "out.png"
    printed = bench(
        "--base-url",
        fast.url + "/v1",
        "--concurrency",
        "1,4",
        "--num-requests",
        "8",
        "--max-tokens",
        "8",
        "--compare",
        slow.url + "/v1",
        "--rounds",
        "2",
        "--cpu-pids",
        str(fast.process.pid),
        "--json",
        str(report_path),
        "--save-requests",
        "--plot",
        str(plot_path),
    )
    report = json.loads(report_path.read_text())

    # `auto` is not served by an engine: the first model it lists is used.
    assert [t["model"] for t in report["targets"]] == ["acme/bench", "acme/slow"]
    # Round 1: A then B at each level; round 2: B first.
    assert [(r["round"], r["label"], r["target"]) for r in report["runs"]] == [
        (1, "c=1", "A"),
        (1, "c=1", "B"),
        (1, "c=4", "A"),
        (1, "c=4", "B"),
        (2, "c=1", "B"),
        (2, "c=1", "A"),
        (2, "c=4", "B"),
        (2, "c=4", "A"),
    ]
    for run in report["runs"]:
        m = run["metrics"]
        assert (m["completed"], m["failed"], m["unfinished"]) == (8, 0, 0)
        assert m["total_output_tokens"] == 64 and m["tokens_counted_from_chunks"] == 0
        assert all(r["output_tokens"] == 8 and r["tokens_from_usage"] for r in run["requests"])
        configured_ttft = 0.020 if run["target"] == "A" else 0.040
        assert min(r["ttft_s"] for r in run["requests"]) >= configured_ttft
        assert m["median_ttft_ms"] >= configured_ttft * 1000
        assert m["output_throughput"] > 0 and m["p99_itl_ms"] > 0
    # The simulator is an engine: its CPU is measured, and no gateway process was.
    cpu = report["runs"][0]["cpu"]
    assert set(cpu["cpu_ms"]) == {"engine"} and cpu["gateway_cpu_ms_per_request"] is None
    assert report["runs"][1]["cpu"] is None

    assert [(row["label"], row["rounds"]) for row in report["compare"]] == [("c=1", 2), ("c=4", 2)]
    for row in report["compare"]:
        assert row["added_ttft_p50_ms"] is not None and row["output_throughput_ratio"] > 0
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert "Completed / failed / unfinished:        8 / 0 / 0" in printed
    assert "Summary (ms; medians over rounds)" in printed
    assert "added p50" in printed and "out tok/s A/B" in printed
    assert f"wrote {report_path}" in printed and f"wrote {plot_path}" in printed


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("429", "http_429:RateLimitError"),
        ("mid-stream", "stream_error:InternalServerError"),
        ("before-first-token", "connection_error"),
        ("hang", "timeout"),
    ],
)
def test_each_failure_is_counted_by_its_kind(fast, tmp_path, fault, kind):
    report_path = tmp_path / "out.json"
    printed = bench(
        "--base-url",
        fast.url + "/v1",
        "--header",
        f"X-Sim-Fail: {fault}",
        "--concurrency",
        "2",
        "--num-requests",
        "4",
        "--max-tokens",
        "8",
        "--timeout",
        "1",
        "--warmup",
        "0",
        "--json",
        str(report_path),
    )
    metrics = json.loads(report_path.read_text())["runs"][0]["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (0, 4)
    assert metrics["errors"] == {kind: 4}
    assert metrics["median_ttft_ms"] is None  # no completed request: no latency figure
    assert f"Failed by error:                        {kind} 4" in printed


def test_injected_faults_fail_requests_and_the_report_counts_them_by_error(faulty, tmp_path):
    report_path = tmp_path / "out.json"
    printed = bench(
        "--base-url",
        faulty.url + "/v1",
        "--concurrency",
        "3",
        "--num-requests",
        "12",
        "--max-tokens",
        "8",
        "--timeout",
        "2",
        "--warmup",
        "0",
        "--json",
        str(report_path),
    )
    metrics = json.loads(report_path.read_text())["runs"][0]["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (0, 12)
    assert sum(metrics["errors"].values()) == 12
    assert set(metrics["errors"]) <= INJECTED_KINDS and len(metrics["errors"]) > 1
    assert "A c=3 failed: " in printed


def test_a_level_ends_at_its_time_budget_with_the_requests_in_flight_unfinished(fast, tmp_path):
    report_path = tmp_path / "out.json"
    bench(
        "--base-url",
        fast.url + "/v1",
        "--header",
        "X-Sim-Fail: hang",
        "--concurrency",
        "2",
        "--num-requests",
        "10",
        "--timeout",
        "30",
        "--max-duration",
        "1",
        "--warmup",
        "0",
        "--json",
        str(report_path),
    )
    metrics = json.loads(report_path.read_text())["runs"][0]["metrics"]
    assert (metrics["completed"], metrics["failed"], metrics["unfinished"]) == (0, 0, 2)
    assert metrics["duration"] < 5


def test_a_poisson_rate_level_sends_every_request(fast, tmp_path):
    report_path = tmp_path / "out.json"
    bench(
        "--base-url",
        fast.url + "/v1",
        "--request-rate",
        "40",
        "--num-requests",
        "10",
        "--max-tokens",
        "4",
        "--dataset",
        "chat",
        "--json",
        str(report_path),
    )
    report = json.loads(report_path.read_text())
    assert report["runs"][0]["level"]["request_rate"] == 40
    assert report["runs"][0]["metrics"]["completed"] == 10
