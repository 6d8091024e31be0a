"""Fair share at an engine's capacity, measured (`manage.py bench_fairness`): a noisy tenant keeping
many long streams going beside a quiet tenant asking one short question at a time, both through
/v1 with API keys of their own; the quiet tenant's time to first token, the engine's output
throughput and the noisy tenant's completions."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from dataclasses import dataclass, field

import openai
from prometheus_client.parser import text_string_to_metric_families

NOISY_QUESTION = "Write a long story about the harbour at dawn, its boats and its gulls."
QUIET_QUESTION = "What time does the harbour office open?"


@dataclass
class Noisy:
    started: int = 0
    completed: int = 0  # ended with a finish reason
    failed: dict[str, int] = field(default_factory=dict)  # by error


@dataclass
class Result:
    ttfts: list[float]  # the quiet tenant's, seconds, after the warm-up
    quiet_failed: int
    noisy: Noisy | None
    output_tokens_per_s: float  # the engine's own count (vllm:generation_tokens_total)
    seconds: float


def generated(simulator_url: str) -> float:
    """The engine's output tokens so far, from its /metrics."""
    with urllib.request.urlopen(f"{simulator_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:generation_tokens_total"
    )


async def _stream(client: openai.AsyncOpenAI, model: str, question: str, max_tokens: int):
    """One streamed answer: (seconds to its first content, whether it ended with a finish
    reason)."""
    started = time.perf_counter()
    first = None
    finished = False
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        stream=True,
    )
    async for chunk in stream:
        if not chunk.choices:
            continue
        if first is None and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.choices[0].finish_reason:
            finished = True
    return first, finished


async def run(
    *,
    url: str,
    simulator_url: str,
    model: str,
    quiet_key: str,
    noisy_key: str | None,
    streams: int,
    long_tokens: int,
    short_tokens: int,
    seconds: float,
    warmup: float,
) -> Result:
    """The quiet tenant for `seconds` (its first `warmup` seconds not counted), beside the noisy
    one's `streams` streams refilled as they end (none when `noisy_key` is None); the noisy
    streams still going at the end are waited for, so every one of them is counted."""
    timeout = 600
    quiet = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=quiet_key, max_retries=0, timeout=timeout
    )
    noisy_client = (
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=noisy_key, max_retries=0, timeout=timeout)
        if noisy_key
        else None
    )
    noisy = Noisy() if noisy_key else None
    stop = asyncio.Event()
    ttfts: list[float] = []
    quiet_failed = 0

    async def noisy_worker() -> None:
        assert noisy is not None and noisy_client is not None
        while not stop.is_set():
            noisy.started += 1
            try:
                _, finished = await _stream(noisy_client, model, NOISY_QUESTION, long_tokens)
            except openai.APIError as exc:
                name = getattr(exc, "code", None) or type(exc).__name__
                noisy.failed[name] = noisy.failed.get(name, 0) + 1
                await asyncio.sleep(0.5)
                continue
            if finished:
                noisy.completed += 1
            else:
                noisy.failed["unfinished"] = noisy.failed.get("unfinished", 0) + 1

    workers = [asyncio.create_task(noisy_worker()) for _ in range(streams if noisy_key else 0)]
    try:
        if workers:
            await asyncio.sleep(warmup)  # the noisy tenant fills the engine first
        before, began = generated(simulator_url), time.perf_counter()
        deadline = began + seconds
        while time.perf_counter() < deadline:
            try:
                first, _ = await _stream(quiet, model, QUIET_QUESTION, short_tokens)
            except openai.APIError:
                quiet_failed += 1
                await asyncio.sleep(0.5)
                continue
            if first is not None and time.perf_counter() - began > (0 if workers else warmup):
                ttfts.append(first)
        after, ended = generated(simulator_url), time.perf_counter()
        stop.set()
        await asyncio.gather(*workers)
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        with contextlib.suppress(Exception):
            await quiet.close()
            if noisy_client is not None:
                await noisy_client.close()
    return Result(
        ttfts=ttfts,
        quiet_failed=quiet_failed,
        noisy=noisy,
        output_tokens_per_s=(after - before) / (ended - began),
        seconds=ended - began,
    )
