"""A load generator for any OpenAI-compatible chat API, in the spirit of `vllm bench serve`:
one level of load against one target.

Two load shapes per level: a closed loop keeping N requests in flight (`Level(concurrency=N)`),
or requests arriving at a rate, Poisson by default or burstier (`Level(request_rate=R,
burstiness=B)`: gamma-distributed gaps, as vLLM does). Every request is a streaming
POST /chat/completions with usage in the last chunk; each one has a timeout, and each level
ends by itself (its request count, then its time budget).

`level_run` runs one level against one target and returns its figures; levels and rounds
against one target or two are benchmarks.loadgen_rounds' `benchmark_run`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from tqdm import tqdm

from .cpu import CpuProbe, cpu_delta
from .metrics import RequestResult, level_metrics

CONNECT_TIMEOUT = (
    10.0  # seconds; a server that does not accept a connection by then is not going to
)
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


def error_kind(prefix: str, error) -> tuple[str, str]:
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
        return error_kind(prefix, body["error"])
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
            result.error, result.detail = error_kind("stream_error", error)
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


def session_open(*, options: LoadOptions) -> aiohttp.ClientSession:
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

    async with session_open(options=options) as session:
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
