"""Spend limits under load, shared by `manage.py bench_spend` and the tests: a burst of concurrent
streams of one API key against a gateway, and the cost of the check itself in this process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import openai
import redis

from spend import ledger
from spend.ledger import counter
from spend.policy import Spec

BURST_QUESTION = [
    {"role": "user", "content": "Describe the harbour at dawn, its boats and its gulls"}
]
# What a tokenizer-free estimate undercounts most: digits and emoji (a token each on Gemma 3's
# tokenizer, several for an emoji outside its vocabulary), CJK, other scripts, beside Latin prose.
_MIXED_PARTS = (
    "Order 4815162342-7730, tracking 90731825446118, phone +86 138 0013 8000, "
    "shipped 2026-12-05 14:32:07 to 東京都港区芝公園4丁目2-8 ✈️📦🚚; ",
    "the invoice says 1,284.50 EUR ≈ ¥203,417 — 请确认付款状态并用中文回答，谢谢！ ",
    "Почему посылка задерживается? 왜 배송이 늦어지나요? क्या आप मदद कर सकते हैं? ",
    "👨‍👩‍👧‍👦🇯🇵🇩🇪🙏🔥✅🧾 ref 31415926535897932384626433832795028841971693993751 ",
    "Where is my parcel, and when will it arrive?",
)
MIXED_QUESTION = [{"role": "user", "content": "".join(_MIXED_PARTS * 2)}]
PROMPTS = {"plain": BURST_QUESTION, "mixed": MIXED_QUESTION}


@dataclass(frozen=True)
class Burst:
    answered: list[int]  # the tokens (prompt + completion) each answered stream used
    refused: int

    @property
    def spent(self) -> int:
        return sum(self.answered)


async def burst(
    *, url: str, key: str, streams: int, max_tokens: int, messages: list[dict] = BURST_QUESTION
) -> Burst:
    """`streams` streams of the key at once through /v1, each asking `messages`."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)

    async def one() -> int | None:
        try:
            stream = await client.chat.completions.create(
                model="auto",
                messages=messages,
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
        except openai.RateLimitError:
            return None
        used = 0
        async for chunk in stream:
            if chunk.usage is not None:
                used = chunk.usage.total_tokens
        return used

    try:
        results = await asyncio.gather(*(one() for _ in range(streams)))
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return Burst([r for r in results if r is not None], sum(r is None for r in results))


def reservation_of(
    *, url: str, key: str, max_tokens: int, limit: int, messages: list[dict] = BURST_QUESTION
) -> int:
    """The tokens one burst question reserves, read from the x-ratelimit headers of a key whose
    tokens per minute is `limit` and has nothing counted yet."""
    answer = openai.OpenAI(
        base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120
    ).chat.completions.with_raw_response.create(
        model="auto", messages=messages, max_tokens=max_tokens
    )
    return limit - int(answer.headers["x-ratelimit-remaining-tokens"])


@dataclass(frozen=True)
class CheckCost:
    requests: int
    counters: int  # counters each request checked and counted
    cpu_us: float  # this process's CPU per request: reserve and settle
    redis_us: float | None  # Redis's own CPU per request (INFO cpu), when readable
    calls: float | None  # script calls per request (INFO commandstats): reservations, settlements
    wall_s: float
    lookup_us: float  # the per-request cost with no limit applying (the common case)


def _redis_cpu(client: redis.Redis) -> float | None:
    try:
        info = client.info("cpu")
    except redis.RedisError:
        return None
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _script_calls(client: redis.Redis) -> int | None:
    try:
        info = client.info("commandstats")
    except redis.RedisError:
        return None
    return sum(info.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


async def check_cost(*, specs: tuple[Spec, ...], requests: int, concurrency: int, redis_url: str):
    """Reserve and settle `requests` answers against `specs` (`concurrency` at a time), as the
    pipeline does for each generated answer; CPU per request of this process and of Redis."""
    from spend.policy import Policies

    server = redis.Redis.from_url(redis_url, socket_timeout=5)
    counters = len(counter.counters(specs))
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            booked = await ledger.areserve(specs, tokens=600, cost=0.0002)
            assert isinstance(booked, ledger.Reservation), booked
            ledger.settle_soon(booked, tokens=420, cost=0.00015)  # as the pipeline does

    await one()  # connections opened, scripts cached
    await ledger.asettled()
    calls_before, redis_before, cpu_before, wall_before = (
        _script_calls(server),
        _redis_cpu(server),
        time.process_time(),
        time.perf_counter(),
    )
    await asyncio.gather(*(one() for _ in range(requests)))
    await ledger.asettled()
    cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    redis_after, calls_after = _redis_cpu(server), _script_calls(server)
    empty = Policies()
    started = time.process_time()
    for _ in range(requests):
        empty.applying(api_key_id=1, user_id=1, groups=frozenset({"support"}))
    lookup = time.process_time() - started
    return CheckCost(
        requests=requests,
        counters=counters,
        cpu_us=cpu / requests * 1e6,
        redis_us=(
            (redis_after - redis_before) / requests * 1e6
            if redis_before is not None and redis_after is not None
            else None
        ),
        calls=(
            (calls_after - calls_before) / requests
            if calls_before is not None and calls_after is not None
            else None
        ),
        wall_s=wall,
        lookup_us=lookup / requests * 1e6,
    )
