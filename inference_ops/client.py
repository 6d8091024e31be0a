"""Streaming chat completions from any OpenAI-compatible engine, through the official SDK.

One pooled `AsyncOpenAI` per endpoint (and event loop) is reused across requests.
Every failure becomes one `EngineError` with a kind, `retryable`, and whether a
token was already produced. Closing or cancelling the consumer closes the
upstream HTTP stream, so the engine stops generating and frees its slot: always
iterate with `contextlib.aclosing(stream_chat(...))` or consume to the end.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import httpx2
import openai
import orjson

from core.loops import PerLoop
from inference_ops.exceptions import EngineError


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
        # CPU of the default httpx one (README, Figures), and the gateway pays it per request.
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


def _from_sdk(
    exc: Exception, *, produced: bool, during_request: bool, endpoint: str
) -> EngineError:
    if isinstance(exc, openai.APITimeoutError):
        if isinstance(exc.__cause__, httpx2.ConnectTimeout):
            # The aiohttp transport reports every connection failure as a connect timeout; the
            # error underneath says whether one was (a refused or reset connection was not).
            root = exc.__cause__.__cause__
            kind = (
                "connect"
                if root is not None and not isinstance(root, TimeoutError)
                else "timeout_connect"
            )
        else:
            kind = "timeout_idle" if produced else "timeout_first_token"
        return EngineError(
            kind, "the engine did not answer in time", produced_tokens=produced, endpoint=endpoint
        )
    if isinstance(exc, openai.APIConnectionError):
        kind = "connect" if during_request else "stream_truncated"
        return EngineError(
            kind,
            f"connection failed: {exc.__cause__ or exc}",
            produced_tokens=produced,
            endpoint=endpoint,
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        kind = (
            "rate_limited" if status == 429 else "server_error" if status >= 500 else "client_error"
        )
        return EngineError(
            kind,
            f"HTTP {status}: {exc.message}",
            produced_tokens=produced,
            status_code=status,
            endpoint=endpoint,
            retry_after=retry_after(exc.response.headers) if status in (429, 503) else None,
        )
    if isinstance(exc, openai.APIError):
        return EngineError(
            "stream_error",
            f"error in the stream: {exc.message}",
            produced_tokens=produced,
            endpoint=endpoint,
        )
    return EngineError(
        "malformed", f"unreadable response: {exc}", produced_tokens=produced, endpoint=endpoint
    )


def retry_after(headers) -> float | None:
    """Seconds from a response's `Retry-After` (seconds or an HTTP date) or OpenAI's
    `retry-after-ms`; None when absent or unreadable."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


_SDK_ERRORS = (openai.APIError, json.JSONDecodeError, ValueError, TypeError, AttributeError)


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
    many. The timeouts are one timer per stream (`_Deadline`), not one per read.
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
        except _SDK_ERRORS as exc:
            raise _from_sdk(exc, produced=False, during_request=True, endpoint=config.name) from exc

        # Raw reads unless the engine compressed the stream: one generator layer less per read.
        encoding = response.headers.get("content-encoding", "").strip().lower()
        reads = response.aiter_bytes() if encoding not in ("", "identity") else response.aiter_raw()
        events = _SSE()
        finish_reason, usage, ttft, count, done = None, None, None, 0, False
        deadline = _Deadline(
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


class _Deadline:
    """The read timeouts of one stream with one timer: until the first token, the `first`
    deadline; after it, `idle` seconds from the start of each read; never past `total`.
    Wrap each read in `with deadline:`; a read that outlives its deadline raises TimeoutError
    (the task is cancelled and uncancelled, as in asyncio.timeout).

    `asyncio.timeout_at` around each read would schedule and cancel a timer per network read;
    here a read only notes the time, and the one timer, when it fires early, moves itself to
    the deadline the reads since have earned."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, first: float, total: float, idle: float):
        self._loop, self._first, self._total, self._idle = loop, first, total, idle
        self._read_started: float | None = None  # None until the first token
        self._task: asyncio.Task | None = None
        self._cancelling = 0
        self._fired = False
        self._timer: asyncio.TimerHandle | None = loop.call_at(first, self._fire)

    def first_token(self) -> None:
        self._read_started = self._loop.time()

    def _due(self) -> float:
        if self._read_started is None:
            return self._first
        return min(self._total, self._read_started + self._idle)

    def __enter__(self) -> None:
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling()
        if self._read_started is not None:
            self._read_started = self._loop.time()
        if self._timer is None:  # it fired while the consumer had the last token
            self._timer = self._loop.call_at(self._due(), self._fire)

    def __exit__(self, exc_type, exc, tb) -> bool:
        task, self._task = self._task, None
        if self._fired:
            self._fired = False
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from None
        return False

    def _fire(self) -> None:
        due = self._due()
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._fire)
        elif self._task is not None:
            self._timer = None
            self._fired = True
            self._task.cancel()
        else:
            self._timer = None  # re-armed by the next read, from its own start

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _SSE:
    """Server-sent events from arbitrary byte reads: `feed` returns the data of each event that
    the bytes so far complete, keeping a partial event for the next read."""

    def __init__(self):
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._rest + data
        if b"\r" in buffer:  # CRLF line ends; a CR split from its LF is completed by the next read
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, self._rest = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            lines = [
                line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
            ]
            if lines:
                payloads.append(lines[0] if len(lines) == 1 else b"\n".join(lines))
        return payloads
