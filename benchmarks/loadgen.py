"""A load generator for any OpenAI-compatible chat API, in the spirit of `vllm bench serve`.

Two load shapes per level: a closed loop keeping N requests in flight (`Level(concurrency=N)`),
or requests arriving at a rate, Poisson by default or burstier (`Level(request_rate=R,
burstiness=B)`: gamma-distributed gaps, as vLLM does). Every request is a streaming
POST /chat/completions with usage in the last chunk; each one has a timeout, and each level
ends by itself (its request count, then its time budget).

In process:

    report = asyncio.run(benchmark_run(targets=[Target(base_url=..., api_key=...)],
                                       levels=[Level(concurrency=16)],
                                       prompts=prompts_builtin(name="kb"),
                                       options=LoadOptions(max_tokens=64)))

`level_run` runs one level against one target and returns its figures; `benchmark_run` runs
levels and rounds against one target or two (interleaved, with the comparison of the first
over the second).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import aiohttp
from tqdm import tqdm

from .cpu import CpuProbe, cpu_delta
from .metrics import RequestResult, level_metrics
from .prompts import PromptSource

CONNECT_TIMEOUT = (
    10.0  # seconds; a server that does not accept a connection by then is not going to
)
MODELS_TIMEOUT = 10.0
READ_BUFFER = (
    2**20
)  # a line longer than aiohttp's default buffer (a long chunk) would fail the read


class BenchError(Exception):
    """The benchmark cannot run: the target is unreachable, refuses the key, or the input is
    wrong."""


@dataclass(frozen=True)
class Target:
    """Where requests go (and, optionally, which local processes to measure the CPU of)."""

    base_url: str  # ends in /v1 for the gateway and for vLLM
    api_key: str | None = None
    model: str = "auto"
    name: str = "A"
    headers: tuple[tuple[str, str], ...] = ()
    cpu: CpuProbe | None = None

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")

    def request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **dict(self.headers)}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(frozen=True)
class Level:
    concurrency: int | None = None  # closed loop: this many requests in flight
    request_rate: float | None = None  # requests per second (math.inf: all at once)
    burstiness: float = 1.0  # 1 is Poisson; lower is burstier, higher more regular
    max_concurrency: int | None = None  # with a rate: a cap on requests in flight

    def __post_init__(self):
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("a level has either a concurrency or a request rate")

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        cap = f" max {self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={rate}/s{cap}"

    @property
    def x(self) -> float:
        """The level's place on a plot's x axis."""
        return self.concurrency if self.concurrency is not None else self.request_rate

    def default_requests(self) -> int:
        # Enough requests that the closed loop spends most of its time at full concurrency,
        # and that a rate level runs for about ten seconds.
        if self.concurrency is not None:
            return max(4 * self.concurrency, 32)
        return 256 if math.isinf(self.request_rate) else max(32, round(10 * self.request_rate))

    def as_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "request_rate": None
            if self.request_rate is None or math.isinf(self.request_rate)
            else self.request_rate,
            "request_rate_inf": self.request_rate is not None and math.isinf(self.request_rate),
            "burstiness": self.burstiness if self.request_rate is not None else None,
            "max_concurrency": self.max_concurrency,
            "label": self.label,
        }


@dataclass(frozen=True)
class LoadOptions:
    max_tokens: int = 128
    num_requests: int | None = None  # per level; None: the level's default
    timeout: float = 120.0  # per request, seconds, the whole stream included
    max_duration: float = 300.0  # per level, seconds: requests still in flight then are cut
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    seed: int = 0
    cooldown: float = 1.0  # seconds between runs, so one level's tail does not load the next
    warmup: int = 1  # requests per target before the first level, not counted
    progress: bool = True


# -- one request ------------------------------------------------------------------------


_CONTENT_KEY = b'"content":'


def _has_content(payload: bytes) -> bool:
    # Byte checks instead of parsing every chunk: at hundreds of streams the client's own CPU
    # would otherwise show up as server latency. Serializers differ on the space after the colon.
    at = payload.find(_CONTENT_KEY)
    if at < 0:
        return False
    at += len(_CONTENT_KEY)
    if payload[at : at + 1] == b" ":
        at += 1
    return payload[at : at + 1] == b'"' and payload[at + 1 : at + 2] != b'"'


def _error_kind(prefix: str, error) -> tuple[str, str]:
    """An OpenAI error object -> ("prefix:code", message). vLLM's code is the HTTP status,
    so its type names the error; the gateway's code is a word."""
    if not isinstance(error, dict):
        return prefix, str(error)[:300]
    code = error.get("code")
    name = code if isinstance(code, str) and code else error.get("type")
    message = str(error.get("message") or "")[:300]
    return (f"{prefix}:{name}" if isinstance(name, str) and name else prefix), message


async def _http_error(response: aiohttp.ClientResponse) -> tuple[str, str]:
    prefix = f"http_{response.status}"
    try:
        text = (await response.content.read(65536)).decode(errors="replace")
    except (aiohttp.ClientError, TimeoutError):
        return prefix, ""
    try:
        body = json.loads(text)
    except ValueError:
        return prefix, text[:300]
    if isinstance(body, dict) and "error" in body:
        return _error_kind(prefix, body["error"])
    return prefix, text[:300]


async def request_send(
    *,
    session: aiohttp.ClientSession,
    target: Target,
    messages: list[dict],
    options: LoadOptions,
    index: int = 0,
    level_start: float | None = None,
) -> RequestResult:
    """One streamed chat completion; never raises for what the server or the network did."""
    body = {
        "model": target.model,
        "messages": messages,
        "max_tokens": options.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.ignore_eos:
        body["ignore_eos"] = True
    data = json.dumps(body).encode()
    start = time.perf_counter()
    result = RequestResult(
        index=index, start=start - (level_start if level_start is not None else start)
    )
    timeout = aiohttp.ClientTimeout(
        total=options.timeout, sock_connect=min(CONNECT_TIMEOUT, options.timeout)
    )
    try:
        async with session.post(
            target.root + "/chat/completions",
            data=data,
            headers=target.request_headers(),
            timeout=timeout,
        ) as response:
            result.status = response.status
            result.route = response.headers.get("X-Route") or None
            result.route_target = response.headers.get("X-Route-Target") or None
            if response.status != 200:
                result.error, result.detail = await _http_error(response)
                result.end = time.perf_counter() - start
                return result
            await _stream_read(response=response, result=result, start=start)
    except TimeoutError:
        result.error, result.detail = "timeout", f"no complete answer within {options.timeout:g} s"
    except aiohttp.ClientError as exc:
        result.error, result.detail = "connection_error", f"{type(exc).__name__}: {exc}"[:300]
    except ValueError as exc:  # a line longer than the read buffer
        result.error, result.detail = "protocol_error", str(exc)[:300]
    if result.end is None:
        result.end = time.perf_counter() - start
    return result


async def _stream_read(
    *, response: aiohttp.ClientResponse, result: RequestResult, start: float
) -> None:
    arrivals = result.chunk_times
    usage = None
    done = False
    async for line in response.content:
        if not line.startswith(b"data:"):
            continue  # blank separators, SSE comments and event names
        now = time.perf_counter()
        payload = line[5:].lstrip()
        if payload.startswith(b"[DONE]"):
            done = True
            break
        if payload.startswith(b'{"error"'):
            try:
                error = json.loads(payload).get("error")
            except ValueError:
                error = payload[:300].decode(errors="replace")
            result.error, result.detail = _error_kind("stream_error", error)
            result.end = now - start
            return
        if _has_content(payload):
            arrivals.append(now - start)
        if b'"usage":{' in payload or b'"usage": {' in payload:
            try:
                usage = json.loads(payload).get("usage")
            except ValueError:
                pass
    result.end = time.perf_counter() - start
    if not done:
        result.error, result.detail = "missing_done", "the stream ended without data: [DONE]"
    elif not arrivals:
        result.error, result.detail = "no_content", "the stream ended without any content"
    else:
        result.ok = True
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            result.output_tokens = usage["completion_tokens"]
            result.input_tokens = (
                usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
            )
            result.tokens_from_usage = True
        else:
            result.output_tokens = len(arrivals)


# -- one level --------------------------------------------------------------------------


def _session(*, options: LoadOptions) -> aiohttp.ClientSession:
    # limit=0: no client-side cap, every request in flight has its own connection.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(
        total=options.timeout, sock_connect=min(CONNECT_TIMEOUT, options.timeout)
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFFER)


async def level_run(
    *,
    target: Target,
    level: Level,
    conversations: list[list[dict]],
    options: LoadOptions,
    round_number: int = 1,
) -> dict:
    """Send one request per conversation at the level's load; return the level's figures.

    The result holds `metrics` (see benchmarks.metrics), `cpu` (when the target has a probe),
    and `requests`, the raw record of each request.
    """
    count = len(conversations)
    results: list[RequestResult] = []
    tasks: list[asyncio.Task] = []
    inflight = 0
    bar = tqdm(
        total=count,
        desc=f"{target.name} {level.label} round {round_number}",
        unit="req",
        file=sys.stderr,
        disable=not options.progress,
        leave=False,
        dynamic_ncols=True,
    )
    cpu_before = target.cpu.snapshot() if target.cpu else None

    async def send(session, index: int, messages: list[dict], level_start: float) -> None:
        nonlocal inflight
        inflight += 1
        result = await request_send(
            session=session,
            target=target,
            messages=messages,
            options=options,
            index=index,
            level_start=level_start,
        )
        inflight -= 1  # skipped when cut at the deadline: what is left counts as unfinished
        results.append(result)
        bar.update(1)

    async with _session(options=options) as session:
        level_start = time.perf_counter()
        deadline = level_start + options.max_duration
        if level.concurrency is not None:
            work = iter(enumerate(conversations))

            async def worker() -> None:
                # One shared iterator: each worker takes the next request as soon as its own ends.
                for index, messages in work:
                    if time.perf_counter() >= deadline:
                        return
                    await send(session, index, messages, level_start)

            tasks = [asyncio.create_task(worker()) for _ in range(min(level.concurrency, count))]
        else:
            tasks.append(
                asyncio.create_task(
                    _dispatch(
                        level=level,
                        conversations=conversations,
                        seed=options.seed,
                        start=level_start,
                        deadline=deadline,
                        send=lambda i, m: send(session, i, m, level_start),
                        spawned=tasks,
                    )
                )
            )
        try:
            while True:
                pending = [t for t in tasks if not t.done()]
                if not pending:
                    break
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                await asyncio.wait(pending, timeout=remaining)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
        duration = time.perf_counter() - level_start
    results.sort(key=lambda r: r.index)
    run = {
        "target": target.name,
        "base_url": target.base_url,
        "model": target.model,
        "round": round_number,
        "level": level.as_dict(),
        "label": level.label,
        "metrics": level_metrics(results=results, duration=duration, unfinished=inflight),
        "cpu": None,
        "requests": [r.as_dict() for r in results],
    }
    if target.cpu:
        run["cpu"] = cpu_delta(
            before=cpu_before, after=target.cpu.snapshot(), requests=len(results) + inflight
        )
        run["cpu"]["note"] = target.cpu.note
    return run


async def _dispatch(
    *,
    level: Level,
    conversations: list[list[dict]],
    seed: int,
    start: float,
    deadline: float,
    send: Callable,
    spawned: list[asyncio.Task],
) -> None:
    """Open-loop arrivals: gaps drawn from a gamma distribution of mean 1/rate (Poisson when
    burstiness is 1), requests started on time whatever the server's pace."""
    rng = random.Random(seed)
    cap = asyncio.Semaphore(level.max_concurrency) if level.max_concurrency else None
    rate = level.request_rate

    async def one(index: int, messages: list[dict]) -> None:
        if cap is None:
            await send(index, messages)
            return
        async with cap:
            await send(index, messages)

    mine = []
    at = start
    for index, messages in enumerate(conversations):
        if index and not math.isinf(rate):
            at += rng.gammavariate(level.burstiness, 1.0 / (rate * level.burstiness))
        if at >= deadline:
            break
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(index, messages))
        spawned.append(task)  # the level cancels it at its deadline
        mine.append(task)
    await asyncio.gather(*mine)


# -- targets, rounds, comparison --------------------------------------------------------


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
    return _error_kind(f"http_{status}", body.get("error") if isinstance(body, dict) else body)


async def _warmup(*, target: Target, prompts: PromptSource, options: LoadOptions) -> list[str]:
    failures = []
    async with _session(options=options) as session:
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
