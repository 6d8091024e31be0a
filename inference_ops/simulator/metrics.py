"""vLLM's Prometheus metrics, written in the text exposition format by hand.

Names, help texts, buckets and labels follow vLLM's V1 PrometheusStatLogger
(labels `model_name` and `engine`), so scrapers, dashboards and routing code
written against a real vLLM read the simulator unchanged.
"""

import math
import time
from bisect import bisect_left
from dataclasses import dataclass

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # per bucket, made cumulative when rendered
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = bisect_left(self.buckets, value)  # first bucket with le >= value
        if index < len(self.buckets):
            self.counts[index] += 1
        self.sum += value
        self.count += 1


@dataclass
class EngineState:
    """The gauges, read from the engine at scrape time."""

    running: int
    waiting: int
    kv_cache_usage: float
    max_loras: int | None = None  # None: LoRA disabled, no vllm:lora_requests_info
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()


class Metrics:
    def __init__(self, model_name: str):
        self._labels = f'engine="0",model_name="{_escape(model_name)}"'
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)

    def render(self, state: EngineState) -> str:
        lines: list[str] = []
        labels = self._labels

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        family(
            "vllm:num_requests_running", "gauge", "Number of requests in model execution batches."
        )
        lines.append(f"vllm:num_requests_running{{{labels}}} {_num(state.running)}")
        family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
        lines.append(f"vllm:num_requests_waiting{{{labels}}} {_num(state.waiting)}")
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
        lines.append(f"vllm:kv_cache_usage_perc{{{labels}}} {_num(state.kv_cache_usage)}")

        if state.max_loras is not None:
            family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
            lines.append(
                f'vllm:lora_requests_info{{max_lora="{state.max_loras}",'
                f'running_lora_adapters="{_escape(",".join(state.running_loras))}",'
                f'waiting_lora_adapters="{_escape(",".join(state.waiting_loras))}"}} '
                f"{_num(time.time())}"
            )

        # Like prometheus_client's 0.0.4 text output, counter families carry the _total suffix.
        family(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        lines.append(
            f"vllm:prefix_cache_queries_total{{{labels}}} {_num(self.prefix_cache_queries)}"
        )
        family(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
        )
        lines.append(f"vllm:prefix_cache_hits_total{{{labels}}} {_num(self.prefix_cache_hits)}")
        family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
        lines.append(f"vllm:prompt_tokens_total{{{labels}}} {_num(self.prompt_tokens)}")
        family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
        lines.append(f"vllm:generation_tokens_total{{{labels}}} {_num(self.generation_tokens)}")
        family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
        for reason, value in self.request_success.items():
            lines.append(
                f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {_num(value)}'
            )

        for name, help_text, histogram in (
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.inter_token,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                self.queue_time,
            ),
        ):
            family(name, "histogram", help_text)
            cumulative = 0
            for le, count in zip(histogram.buckets, histogram.counts):
                cumulative += count
                lines.append(f'{name}_bucket{{{labels},le="{_num(le)}"}} {_num(cumulative)}')
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {_num(histogram.count)}')
            lines.append(f"{name}_count{{{labels}}} {_num(histogram.count)}")
            lines.append(f"{name}_sum{{{labels}}} {_num(histogram.sum)}")
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
