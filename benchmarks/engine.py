"""Benchmark: does the simulator pace like a continuous-batching engine under load?

    python -m benchmarks.engine [--concurrency 1,2,8,32,128,256]
        [--max-tokens 64] [--ttft 50] [--itl 20]

Starts a simulator subprocess on a free loopback port, then for each
concurrency level sends that many streaming chat requests at once and reports
the makespan (against the single-request makespan: close to 1x is continuous
batching working), and client-observed TTFT and inter-chunk latency against
the configured values. All traffic stays on 127.0.0.1; every run is bounded.

The streaming client here is also the chat benchmark's baseline: the same load
straight to the engine, without the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from dataclasses import dataclass

import aiohttp

from benchmarks import servers
from benchmarks.stats import percentile

MESSAGES = [{"role": "user", "content": "Write a short paragraph about lighthouses."}]


@dataclass
class Result:
    ttft: float
    gaps: list[float]
    tokens: int
    chunks: int
    end: float  # seconds from the request's start to the end of its stream


async def one_request(
    session: aiohttp.ClientSession, url: str, *, max_tokens: int, model: str | None = None
) -> Result:
    """One streamed chat completion from the engine at `url` (its base, without /v1)."""
    body = {
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"model": model} if model else {}),
    }
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            # Cheap byte checks instead of parsing every chunk: at 256 streams the
            # client's own CPU would otherwise show up as server latency.
            if line.startswith(b"data: [DONE]"):
                break
            if b'"usage":{' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
            elif b'"content":"' in line and b'"content":""' not in line:
                arrivals.append(time.perf_counter())
    end = time.perf_counter()
    if tokens != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, got {tokens}")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return Result(
        ttft=arrivals[0] - start, gaps=gaps, tokens=tokens, chunks=len(arrivals), end=end - start
    )


async def run_level(
    *,
    url: str,
    concurrency: int,
    max_tokens: int,
    timeout: float,
    answers: int = 1,
    model: str | None = None,
) -> tuple[float, list[Result]]:
    """`concurrency` streams at once, each asking `answers` times one after another; the makespan
    and every result. `timeout` bounds each request."""
    # limit=0: no client-side connection cap, every stream gets its own connection.
    connector = aiohttp.TCPConnector(limit=0)
    client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:

        async def stream() -> list[Result]:
            return [
                await one_request(session, url, max_tokens=max_tokens, model=model)
                for _ in range(answers)
            ]

        start = time.perf_counter()
        per_stream = await asyncio.gather(*[stream() for _ in range(concurrency)])
        return time.perf_counter() - start, [result for results in per_stream for result in results]


async def server_histograms(url: str) -> dict[str, float]:
    """Sum and count of the simulator's own TTFT and inter-token histograms."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
    values = {}
    for line in text.splitlines():
        for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
            for part in ("_sum", "_count"):
                if line.startswith(name + part + "{"):
                    values[name + part] = float(line.rsplit(" ", 1)[1])
    return values


def server_mean_ms(before: dict, after: dict, name: str) -> float:
    count = after[name + "_count"] - before[name + "_count"]
    return 1000 * (after[name + "_sum"] - before[name + "_sum"]) / count if count else float("nan")


def simulator_args(*, max_num_seqs: int, ttft: float, itl: float) -> list[str]:
    """The simulator's flags for a paced run: the engine's batch size and configured latencies."""
    return [
        "--max-num-seqs",
        str(max_num_seqs),
        "--time-to-first-token",
        str(ttft),
        "--inter-token-latency",
        str(itl),
        "--seed",
        "0",
    ]


async def bench(args: argparse.Namespace, url: str) -> None:
    print(
        f"simulator: TTFT {args.ttft:g} ms, ITL {args.itl:g} ms, "
        f"{args.max_tokens} tokens per request, max-num-seqs {max(args.concurrency)}.\n"
        "TTFT and ITL percentiles are what the client sees; "
        "'srv' columns are the engine's own means from /metrics "
        "(the gap is HTTP and client overhead)."
    )
    header = (
        f"{'conc':>5} {'makespan s':>10} {'x single':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'srv TTFT':>9} {'srv ITL':>8} {'chunks/tok':>10}"
    )
    print(header)
    print("-" * len(header))
    single = None
    # Ideal makespan of one request: the first token, then one step per further token.
    timeout = 30 + 5 * (args.ttft + args.itl * args.max_tokens) / 1000
    for concurrency in args.concurrency:
        before = await server_histograms(url)
        makespan, results = await run_level(
            url=url, concurrency=concurrency, max_tokens=args.max_tokens, timeout=timeout
        )
        after = await server_histograms(url)
        server_ttft = server_mean_ms(before, after, "vllm:time_to_first_token_seconds")
        server_itl = server_mean_ms(before, after, "vllm:inter_token_latency_seconds")
        single = single or makespan
        ttfts = [r.ttft * 1000 for r in results]
        gaps = [g * 1000 for r in results for g in r.gaps]
        chunk_ratio = sum(r.chunks for r in results) / sum(r.tokens for r in results)
        print(
            f"{concurrency:>5} {makespan:>10.3f} {makespan / single:>8.2f}x "
            f"{percentile(ttfts, 0.5):>9.1f} {percentile(ttfts, 0.99):>9.1f} "
            f"{percentile(gaps, 0.5):>8.1f} {percentile(gaps, 0.99):>8.1f} "
            f"{server_ttft:>9.1f} {server_itl:>8.1f} {chunk_ratio:>10.2f}",
            flush=True,
        )
        await asyncio.sleep(0.5)  # let the engine go idle between levels
    ideal = (args.ttft + args.itl * (args.max_tokens - 1)) / 1000
    print(
        f"ideal single-request makespan: {ideal:.3f} s "
        f"(configured TTFT {args.ttft:g} ms, ITL {args.itl:g} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--concurrency", default="1,2,8,32,128,256", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--ttft", type=float, default=50.0, help="configured time to first token, ms"
    )
    parser.add_argument(
        "--itl", type=float, default=20.0, help="configured inter-token latency, ms"
    )
    args = parser.parse_args(argv)
    sim_args = simulator_args(max_num_seqs=max(args.concurrency), ttft=args.ttft, itl=args.itl)
    try:
        with servers.simulator(model="bench/model", args=sim_args) as url:
            asyncio.run(bench(args, url))
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
