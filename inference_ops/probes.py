"""HTTP probes of an OpenAI-compatible server (an engine of ours or a router): /health, the
served model in /v1/models, and the few gauges routing reads from its Prometheus /metrics.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from inference_ops import engine_keys
from inference_ops.models import EngineProcess

logger = logging.getLogger(__name__)


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(  # noqa: S310 - the engine's own http:// base_url
            urllib.request.Request(url, headers=headers or {}),  # noqa: S310 - as above
            timeout=timeout,
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe(engine: EngineProcess, timeout: float | None = None) -> tuple[bool, str, dict]:
    """(healthy, reason, metrics): /health, the served model in /v1/models, and a /metrics
    scrape."""
    return probe_url(
        engine.base_url,
        engine.api_name,
        timeout or settings.ENGINE_CHECK_TIMEOUT,
        engine_keys.auth_headers(engine) or None,  # the key our engines require
    )


def probe_url(
    root: str, model: str, timeout: float, headers: dict[str, str] | None = None
) -> tuple[bool, str, dict]:
    """`probe` of any server by its root URL (without /v1) and the model it must list;
    `headers` carry a router's key."""
    try:
        status, _ = _get(f"{root}/health", timeout, headers)
        if status != 200:
            return False, f"/health answered {status}", {}
        status, body = _get(f"{root}/v1/models", timeout, headers)
        names = (
            {card.get("id") for card in json.loads(body).get("data", [])}
            if status == 200
            else set()
        )
        if model not in names:
            return False, f"/v1/models does not list {model!r} (status {status})", {}
        status, body = _get(f"{root}/metrics", timeout, headers)
        metrics = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}
    except (OSError, ValueError) as exc:
        return False, f"no answer: {exc}", {}
    return True, "healthy", metrics


_SCRAPED = {
    # vLLM
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # before vLLM 0.10
    # Counters, in tokens: how much of the prompts the engine found already in its KV cache.
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    # llama.cpp's server (--metrics)
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:kv_cache_usage_ratio": "kv_cache_usage",
}


def parse_metrics(text: str) -> dict[str, float]:
    """The few gauges routing needs and the prefix-cache counters, summed over labels, from
    Prometheus text (prometheus_client's parser: labels with spaces, escapes and sample timestamps
    read right). What precedes a line the parser cannot read is kept."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _SCRAPED.get(sample.name)
                if key is not None:
                    found[key] = found.get(key, 0.0) + sample.value
    except ValueError as exc:
        logger.warning("unreadable engine metrics (%s); keeping the gauges read before it", exc)
    return found
