"""Levels and rounds of the load generator (benchmarks.loadgen) against one target or two: the
model to send, the warm-up, the runs interleaved round by round, and the summary across rounds
with the comparison of the first target over the second.

In process:

    report = asyncio.run(benchmark_run(targets=[Target(base_url=..., api_key=...)],
                                       levels=[Level(concurrency=16)],
                                       prompts=prompts_builtin(name="kb"),
                                       options=LoadOptions(max_tokens=64)))
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from benchmarks.loadgen import (
    BenchError,
    Level,
    LoadOptions,
    Target,
    error_kind,
    level_run,
    request_send,
    session_open,
)
from benchmarks.prompts import PromptSource

MODELS_TIMEOUT = 10.0


async def model_resolve(*, target: Target) -> tuple[str, str]:
    """The model name to send, and a note for the user. `auto` stays `auto` where it is served
    (the gateway) and becomes the first listed model elsewhere (an engine)."""
    url = target.root + "/models"
    headers = {k: v for k, v in target.request_headers().items() if k != "Content-Type"}
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT)
        ) as session:
            async with session.get(url, headers=headers) as response:
                status = response.status
                text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    if status in (401, 403):
        kind, message = _http_error_text(status, text)
        raise BenchError(f"{url} refused the API key ({kind}): {message}")
    if status != 200:
        return target.model, f"GET {url} answered {status}; sending model {target.model!r} as given"
    try:
        ids = [
            m["id"]
            for m in json.loads(text)["data"]
            if isinstance(m, dict) and isinstance(m.get("id"), str)
        ]
    except (ValueError, KeyError, TypeError):
        return (
            target.model,
            f"GET {url} did not list models; sending model {target.model!r} as given",
        )
    if target.model == "auto" and "auto" not in ids and ids:
        return ids[0], f"model auto -> {ids[0]!r}, the first of {len(ids)} listed by {url}"
    if target.model not in ids:
        return (
            target.model,
            f"model {target.model!r} is not among those {url} lists ({', '.join(ids[:8])})",
        )
    return target.model, f"model {target.model!r}"


def _http_error_text(status: int, text: str) -> tuple[str, str]:
    try:
        body = json.loads(text)
    except ValueError:
        return f"http_{status}", text[:300]
    return error_kind(f"http_{status}", body.get("error") if isinstance(body, dict) else body)


async def _warmup(*, target: Target, prompts: PromptSource, options: LoadOptions) -> list[str]:
    failures = []
    async with session_open(options=options) as session:
        for messages in prompts.take(count=options.warmup):
            result = await request_send(
                session=session, target=target, messages=messages, options=options
            )
            if not result.ok:
                failures.append(f"{result.error}: {result.detail}".rstrip(": "))
    return failures


async def benchmark_run(
    *,
    targets: list[Target],
    levels: list[Level],
    prompts: PromptSource,
    options: LoadOptions,
    rounds: int = 1,
    on_run: Callable[[dict], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict:
    """Every level against every target, `rounds` times; the report of it all.

    With two targets the runs interleave: in each round, for each level, the first target then
    the second, the order swapped every other round, so drift in the machine's load or the
    server's state falls on both alike. The report's `compare` gives, per level, the TTFT the
    first target adds over the second and their output-throughput ratio, medians over rounds.
    Each (round, level) sends both targets the same mix of base prompts, each made unique.
    """
    if not 1 <= len(targets) <= 2:
        raise BenchError("one target, or two to compare")
    note = on_note or (lambda text: None)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    resolved = []
    for target in targets:
        model, message = await model_resolve(target=target)
        note(f"{target.name} {target.base_url}: {message}")
        resolved.append(replace(target, model=model))
    for target in resolved:
        if options.warmup:
            for failure in await _warmup(target=target, prompts=prompts, options=options):
                note(f"{target.name}: a warm-up request failed: {failure}")
    runs = []
    for round_number in range(1, rounds + 1):
        for level in levels:
            count = options.num_requests or level.default_requests()
            first = prompts.position
            order = resolved if round_number % 2 else resolved[::-1]
            for target in order:
                conversations = prompts.take(count=count, start=first)
                run = await level_run(
                    target=target,
                    level=level,
                    conversations=conversations,
                    options=options,
                    round_number=round_number,
                )
                runs.append(run)
                if on_run:
                    on_run(run)
                await asyncio.sleep(options.cooldown)
            prompts.advance(count=count)
    report = {
        "benchmark": {
            "started_at": started_at,
            "rounds": rounds,
            "levels": [level.as_dict() for level in levels],
            "dataset": prompts.name,
            "repeat_prompts": prompts.repeat,
            "prompt_tag": prompts.run_tag,
            "max_tokens": options.max_tokens,
            "num_requests": options.num_requests,
            "timeout": options.timeout,
            "max_duration": options.max_duration,
            "ignore_eos": options.ignore_eos,
            "seed": options.seed,
            "warmup": options.warmup,
        },
        "targets": [{"name": t.name, "base_url": t.base_url, "model": t.model} for t in resolved],
        "runs": runs,
        "summary": summary_build(runs=runs, targets=[t.name for t in resolved], levels=levels),
        "compare": comparison_build(
            runs=runs, a=resolved[0].name, b=resolved[1].name, levels=levels
        )
        if len(resolved) == 2
        else None,
    }
    return report


SUMMARY_KEYS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p90_e2el_ms",
    "p99_e2el_ms",
)


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else None


def summary_build(*, runs: list[dict], targets: list[str], levels: list[Level]) -> list[dict]:
    """Per target and level: counts summed over rounds, figures as the median over rounds."""
    rows = []
    for name in targets:
        for level in levels:
            mine = [r for r in runs if r["target"] == name and r["label"] == level.label]
            if not mine:
                continue
            errors: dict[str, int] = {}
            routes: dict[str, int] = {}
            for run in mine:
                for kind, n in run["metrics"]["errors"].items():
                    errors[kind] = errors.get(kind, 0) + n
                for road, n in run["metrics"]["routes"].items():
                    routes[road] = routes.get(road, 0) + n
            row = {
                "target": name,
                "label": level.label,
                "x": level.x,
                "rounds": len(mine),
                "completed": sum(r["metrics"]["completed"] for r in mine),
                "failed": sum(r["metrics"]["failed"] for r in mine),
                "unfinished": sum(r["metrics"]["unfinished"] for r in mine),
                "errors": errors,
                "routes": routes,
            }
            for key in SUMMARY_KEYS:
                row[key] = _median([r["metrics"][key] for r in mine])
            row["gateway_cpu_ms_per_request"] = _median(
                [r["cpu"]["gateway_cpu_ms_per_request"] for r in mine if r["cpu"]]
            )
            rows.append(row)
    return rows


def comparison_build(*, runs: list[dict], a: str, b: str, levels: list[Level]) -> list[dict]:
    """Per level: A's TTFT minus B's (p50, p99) and A's output throughput over B's, each taken
    round by round (the two ran back to back) and then the median over rounds."""
    rows = []
    for level in levels:
        per_round = []
        for round_number in sorted({r["round"] for r in runs}):
            pair = {
                r["target"]: r["metrics"]
                for r in runs
                if r["round"] == round_number and r["label"] == level.label
            }
            if a not in pair or b not in pair:
                continue
            ma, mb = pair[a], pair[b]
            per_round.append(
                {
                    "round": round_number,
                    "added_ttft_p50_ms": ma["median_ttft_ms"] - mb["median_ttft_ms"],
                    "added_ttft_p99_ms": ma["p99_ttft_ms"] - mb["p99_ttft_ms"],
                    "output_throughput_ratio": ma["output_throughput"] / mb["output_throughput"]
                    if mb["output_throughput"]
                    else None,
                }
            )
        rows.append(
            {
                "label": level.label,
                "x": level.x,
                "rounds": len(per_round),
                "added_ttft_p50_ms": _median([r["added_ttft_p50_ms"] for r in per_round]),
                "added_ttft_p99_ms": _median([r["added_ttft_p99_ms"] for r in per_round]),
                "output_throughput_ratio": _median(
                    [r["output_throughput_ratio"] for r in per_round]
                ),
                "per_round": per_round,
            }
        )
    return rows
