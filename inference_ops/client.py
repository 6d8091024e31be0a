"""Streaming chat completions from any OpenAI-compatible engine, through the official SDK.

One pooled `AsyncOpenAI` per endpoint (and event loop) is reused across requests.
Every failure becomes one `EngineError` with a kind, `retryable`, and whether a
token was already produced. Closing or cancelling the consumer closes the
upstream HTTP stream, so the engine stops generating and frees its slot: always
iterate with `contextlib.aclosing(stream_chat(...))` or consume to the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import httpx2
import openai
import orjson

from core.loops import PerLoop
from inference_ops.exceptions import EngineError
from inference_ops.sdk_errors import SDK_ERRORS, engine_error_from_sdk
from inference_ops.sse import SSEDecoder
from inference_ops.stream_deadline import StreamDeadline


@dataclass(frozen=True)
class EndpointConfig:
    """What a call needs from a ModelEndpoint row: immutable, hashable, safe across threads."""

    name: str
    base_url: str
    model: str
    api_key: str = ""
    connect_timeout: float = 3.0
    first_token_timeout: float = 30.0
    idle_timeout: float = 15.0
    total_timeout: float = 300.0
    max_concurrency: int = 64
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_endpoint(cls, endpoint) -> EndpointConfig:
        return cls(
            name=endpoint.name,
            base_url=endpoint.base_url,
            model=endpoint.request_model,
            api_key=endpoint.api_key,
            connect_timeout=endpoint.connect_timeout,
            first_token_timeout=endpoint.first_token_timeout,
            idle_timeout=endpoint.idle_timeout,
            total_timeout=endpoint.total_timeout,
            max_concurrency=endpoint.max_concurrency,
            headers=tuple(
                sorted((str(k), str(v)) for k, v in (endpoint.extra_headers or {}).items())
            ),
        )


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Token:
    text: str  # the content of every chunk that arrived in one network read, joined
    elapsed: float  # seconds since the request started
    chunks: int = 1  # how many content chunks the engine sent for it


@dataclass
class Finish:
    finish_reason: str
    usage: Usage | None
    ttft: float | None  # seconds to the first token
    total: float
    tokens: int  # content chunks received


class _Pool:
    def __init__(self, config: EndpointConfig):
        # No read timeout for the transport: stream_chat bounds the response headers and every
        # read itself (one timer per stream). Given one, aiohttp re-arms a timer on each chunk it
        # receives, a timer heap operation per token and stream.
        timeout = httpx2.Timeout(
            connect=config.connect_timeout, read=None, write=10.0, pool=config.first_token_timeout
        )
        # The SDK's aiohttp transport: a streamed request costs the gateway less than half the
        # CPU of the default httpx one (docs/benchmarks.md#fig-aiohttp-transport), paid per request.
        # Connections: as many as the endpoint may have in flight, all kept alive between requests.
        limits = httpx2.Limits(
            max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency
        )
        # Retries belong to the pipeline (it may pick another target), not to the SDK.
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key or "EMPTY",
            timeout=timeout,
            max_retries=0,
            default_headers=dict(config.headers) or None,
            http_client=openai.DefaultAioHttpClient(timeout=timeout, limits=limits),
        )
        self.slots = asyncio.Semaphore(config.max_concurrency)


# HTTP connections belong to the event loop that opened them: one pool per (endpoint, loop).
_pools: PerLoop[_Pool] = PerLoop()


def _pool_for(config: EndpointConfig) -> _Pool:
    return _pools.get(lambda: _Pool(config), config)


async def stream_chat(
    config: EndpointConfig,
    messages: list[dict],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    stop: list[str] | None = None,
    extra_body: dict | None = None,
    extra_headers: dict[str, str] | None = None,
) -> AsyncGenerator[Token | Finish, None]:
    """Yield Token events, then one Finish; raise EngineError on any failure.

    The SDK sends the request (`client.post`, the SDK's documented way to a raw response: its
    typed `create` walks every message through its TypedDict annotations, which under load
    cost more than the rest of the request); the response's server-sent events are read raw,
    a network read at a time, and the content of every chunk in one read leaves as one Token.
    Per-chunk work is one `orjson.loads`: the SDK would build a pydantic model per chunk, and
    under load a read holds many chunks, which then cost the layers above one event instead of
    many. The timeouts are one timer per stream (`StreamDeadline`), not one per read.
    """
    pool = _pool_for(config)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first_deadline = started + config.first_token_timeout
    total_deadline = started + config.total_timeout
    produced = False
    response = None
    deadline = None
    acquired = False
    body = {
        "model": config.model,
        "messages": messages,
        "stream": True,
        **_options(max_tokens, temperature, stop),
        **(extra_body or {}),
    }
    try:
        try:
            async with asyncio.timeout_at(min(first_deadline, total_deadline)):
                await pool.slots.acquire()
                acquired = True
                response = await pool.client.post(
                    "/chat/completions",
                    cast_to=httpx2.Response,
                    body=body,
                    stream=True,
                    stream_cls=None,
                    options={"headers": extra_headers} if extra_headers else {},
                )
        except TimeoutError:
            what = (
                "no response headers in time"
                if acquired
                else f"all {config.max_concurrency} slots stayed busy"
            )
            raise EngineError("timeout_first_token", what, endpoint=config.name) from None
        except SDK_ERRORS as exc:
            raise engine_error_from_sdk(
                exc, produced=False, during_request=True, endpoint=config.name
            ) from exc

        # Raw reads unless the engine compressed the stream: one generator layer less per read.
        encoding = response.headers.get("content-encoding", "").strip().lower()
        reads = response.aiter_bytes() if encoding not in ("", "identity") else response.aiter_raw()
        events = SSEDecoder()
        finish_reason, usage, ttft, count, done = None, None, None, 0, False
        deadline = StreamDeadline(
            loop,
            first=min(first_deadline, total_deadline),
            total=total_deadline,
            idle=config.idle_timeout,
        )
        while True:
            try:
                with deadline:
                    data = await reads.__anext__()
            except StopAsyncIteration:
                break
            except (TimeoutError, httpx2.TimeoutException):
                if loop.time() >= total_deadline:
                    kind, what = (
                        "timeout_total",
                        f"the request took longer than {config.total_timeout:g}s",
                    )
                elif produced:
                    kind, what = "timeout_idle", f"no token for {config.idle_timeout:g}s"
                else:
                    kind, what = (
                        "timeout_first_token",
                        f"no first token in {config.first_token_timeout:g}s",
                    )
                raise EngineError(
                    kind, what, produced_tokens=produced, endpoint=config.name
                ) from None
            except httpx2.TransportError as exc:
                raise EngineError(
                    "stream_truncated",
                    f"the connection broke: {exc}",
                    produced_tokens=produced,
                    endpoint=config.name,
                ) from exc
            if done:
                continue  # read the body to its end, so the connection goes back to the pool
            texts: list[str] = []
            failed: EngineError | None = None
            for payload in events.feed(data):
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    chunk = orjson.loads(payload)
                    if "error" in chunk:
                        error = chunk["error"]
                        message = error.get("message") if isinstance(error, dict) else error
                        failed = EngineError(
                            "stream_error",
                            f"error in the stream: {message}",
                            produced_tokens=produced or bool(texts),
                            endpoint=config.name,
                        )
                        break
                    if chunk.get("usage"):
                        usage = Usage(
                            chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"]
                        )
                    for choice in chunk.get("choices") or ():
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            texts.append(text)
                        if choice.get("finish_reason"):
                            finish_reason = choice["finish_reason"]
                except (
                    orjson.JSONDecodeError,
                    ValueError,
                    TypeError,
                    AttributeError,
                    KeyError,
                ) as exc:
                    failed = EngineError(
                        "malformed",
                        f"unreadable chunk: {exc}",
                        produced_tokens=produced or bool(texts),
                        endpoint=config.name,
                    )
                    break
            if texts:
                # What arrived before a failure in the same read still reaches the caller.
                elapsed = loop.time() - started
                if not produced:
                    produced, ttft = True, elapsed
                    deadline.first_token()
                count += len(texts)
                yield Token(text="".join(texts), elapsed=elapsed, chunks=len(texts))
            if failed is not None:
                raise failed
        if finish_reason is None:
            raise EngineError(
                "stream_truncated",
                "the stream ended without a finish reason",
                produced_tokens=produced,
                endpoint=config.name,
            )
        yield Finish(
            finish_reason=finish_reason,
            usage=usage,
            ttft=ttft,
            total=loop.time() - started,
            tokens=count,
        )
    finally:
        if deadline is not None:
            deadline.close()
        if response is not None:
            # Closing the response tells the engine the client is gone: vLLM aborts the request.
            await response.aclose()
        if acquired:
            pool.slots.release()


def _options(max_tokens: int | None, temperature: float | None, stop: list[str] | None) -> dict:
    options: dict = {"stream_options": {"include_usage": True}}
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    if temperature is not None:
        options["temperature"] = temperature
    if stop:
        options["stop"] = stop
    return options
