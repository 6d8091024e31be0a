"""Per-request records and the statistics of one load level, with vLLM's definitions.

    TTFT   time from sending the request to the first chunk that carries content
    ITL    the gaps between consecutive content chunks, pooled over all requests
    TPOT   per request, (E2E latency - TTFT) / (output tokens - 1), for requests of 2+ tokens
    E2E    time from sending the request to the end of its stream

Percentiles interpolate linearly between closest ranks (benchmarks.stats: numpy's default,
which vLLM uses). Only completed requests enter the latency figures; failed ones are counted
by error kind. Throughputs are over the level's duration: from its first request sent to its
last one ended. The JSON keys are vLLM's (`mean_ttft_ms`, `p99_itl_ms`, `output_throughput`,
...), so tooling written for `vllm bench serve` results reads these too.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from .stats import percentile

PERCENTILES = (50, 90, 99)
# Metric name in vLLM's JSON -> how it reads in a table.
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


@dataclass
class RequestResult:
    """What the client saw of one request. Times are seconds from the request's own start,
    except `start`, which is from the level's start."""

    index: int
    start: float
    ok: bool = False
    error: str | None = (
        None  # kind: "http_429:rate_limit_exceeded", "timeout", "stream_error:...", ...
    )
    detail: str = ""  # the server's message or the exception, for a human
    status: int | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrivals of chunks with content
    end: float | None = None
    output_tokens: int | None = None
    input_tokens: int | None = None
    tokens_from_usage: bool = False
    route: str | None = None
    route_target: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.end is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.end - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "start_s": self.start,
            "ok": self.ok,
            "error": self.error,
            "detail": self.detail,
            "status": self.status,
            "ttft_s": self.ttft,
            "latency_s": self.end,
            "tpot_s": self.tpot,
            "chunk_times_s": self.chunk_times,
            "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens,
            "tokens_from_usage": self.tokens_from_usage,
            "route": self.route,
            "route_target": self.route_target,
        }


def summary_ms(values_s: list[float], *, name: str) -> dict[str, float]:
    """Mean, median, standard deviation and percentiles of seconds, in milliseconds."""
    values = [v * 1000 for v in values_s]
    out = {
        f"mean_{name}_ms": statistics.fmean(values) if values else math.nan,
        f"median_{name}_ms": statistics.median(values) if values else math.nan,
        # vLLM reports numpy's std, the population one.
        f"std_{name}_ms": statistics.pstdev(values) if values else math.nan,
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = percentile(values, p / 100)
    return out


def level_metrics(*, results: list[RequestResult], duration: float, unfinished: int = 0) -> dict:
    """The figures of one level: counts, errors by kind, throughputs and latency summaries.

    `duration` is the level's wall time in seconds; `unfinished` counts the requests still in
    flight when the level's time ran out (neither completed nor failed: the server was not
    given the chance to finish them).
    """
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    output_tokens = sum(r.output_tokens or 0 for r in done)
    input_tokens = sum(r.input_tokens or 0 for r in done)
    per_second = (lambda n: n / duration) if duration > 0 else (lambda n: math.nan)
    metrics = {
        "duration": duration,
        "completed": len(done),
        "failed": len(failed),
        "unfinished": unfinished,
        "errors": dict(Counter(r.error for r in failed).most_common()),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        # Requests whose stream had no usage chunk: their output tokens are their content
        # chunks, which undercounts when a server sends several tokens in one chunk.
        "tokens_counted_from_chunks": sum(1 for r in done if not r.tokens_from_usage),
        "request_throughput": per_second(len(done)),
        "output_throughput": per_second(output_tokens),
        "total_token_throughput": per_second(input_tokens + output_tokens),
        "routes": dict(Counter(r.route for r in results if r.route).most_common()),
        "route_targets": dict(
            Counter(r.route_target for r in results if r.route_target).most_common()
        ),
    }
    metrics.update(summary_ms([r.ttft for r in done], name="ttft"))
    metrics.update(summary_ms([r.tpot for r in done if r.tpot is not None], name="tpot"))
    metrics.update(summary_ms([gap for r in done for gap in r.itls], name="itl"))
    metrics.update(summary_ms([r.end for r in done], name="e2el"))
    return metrics
