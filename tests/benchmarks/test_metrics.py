"""The figures of a level, computed from requests whose timings are known."""

import math

import pytest

from benchmarks.metrics import RequestResult, level_metrics
from benchmarks.stats import percentile


def completed(index, chunk_times, end, tokens, *, usage=True, route=None):
    return RequestResult(
        index=index,
        start=0.0,
        ok=True,
        chunk_times=chunk_times,
        end=end,
        output_tokens=tokens,
        input_tokens=10 if usage else None,
        tokens_from_usage=usage,
        route=route,
    )


def failed(index, error):
    return RequestResult(index=index, start=0.0, error=error, end=0.5)


@pytest.fixture
def metrics():
    results = [
        completed(0, [0.1, 0.12, 0.15, 0.19], 0.2, 4, route="local"),
        completed(1, [0.2, 0.25], 0.3, 2, route="kb"),
        failed(2, "timeout"),
        failed(3, "http_429:rate_limit_exceeded"),
        failed(4, "timeout"),
    ]
    return level_metrics(results=results, duration=2.0, unfinished=1)


def test_ttft_is_the_first_content_chunk_and_its_percentiles_interpolate(metrics):
    assert metrics["mean_ttft_ms"] == pytest.approx(150)
    assert metrics["median_ttft_ms"] == pytest.approx(150)
    assert metrics["p90_ttft_ms"] == pytest.approx(190)
    assert metrics["p99_ttft_ms"] == pytest.approx(199)
    assert metrics["std_ttft_ms"] == pytest.approx(50)


def test_itl_pools_the_gaps_between_content_chunks_of_all_requests(metrics):
    # Gaps 20, 30, 40 ms in the first request, 50 ms in the second.
    assert metrics["mean_itl_ms"] == pytest.approx(35)
    assert metrics["median_itl_ms"] == pytest.approx(35)
    assert metrics["p99_itl_ms"] == pytest.approx(49.7)


def test_tpot_is_latency_after_the_first_token_over_the_tokens_after_it(metrics):
    # (0.2 - 0.1) / 3 and (0.3 - 0.2) / 1.
    assert metrics["mean_tpot_ms"] == pytest.approx((100 / 3 + 100) / 2)
    assert metrics["median_tpot_ms"] == pytest.approx((100 / 3 + 100) / 2)
    assert metrics["mean_e2el_ms"] == pytest.approx(250)


def test_failed_requests_are_counted_by_error_and_kept_out_of_latency_and_throughput(metrics):
    assert (metrics["completed"], metrics["failed"], metrics["unfinished"]) == (2, 3, 1)
    assert metrics["errors"] == {"timeout": 2, "http_429:rate_limit_exceeded": 1}
    assert metrics["request_throughput"] == pytest.approx(1.0)
    assert metrics["output_throughput"] == pytest.approx(3.0)
    assert metrics["total_token_throughput"] == pytest.approx(13.0)
    assert metrics["routes"] == {"local": 1, "kb": 1}


def test_a_request_without_a_usage_chunk_is_flagged():
    metrics = level_metrics(results=[completed(0, [0.1, 0.2], 0.2, 2, usage=False)], duration=1.0)
    assert metrics["tokens_counted_from_chunks"] == 1
    assert metrics["total_output_tokens"] == 2


def test_a_level_with_no_completed_request_has_no_latency_figures():
    metrics = level_metrics(results=[failed(0, "connection_error")], duration=1.0)
    assert metrics["completed"] == 0 and metrics["errors"] == {"connection_error": 1}
    assert math.isnan(metrics["median_ttft_ms"]) and math.isnan(metrics["p99_tpot_ms"])


def test_percentile_is_linear_between_closest_ranks():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 1) == 5.0
    assert percentile(values, 0.99) == pytest.approx(4.96)
    assert percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))
