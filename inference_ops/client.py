"""Streaming chat completions from any OpenAI-compatible engine, through the official SDK.

One pooled `AsyncOpenAI` per endpoint (and event loop) is reused across requests.
Every failure becomes one `EngineError` with a kind, `retryable`, and whether a
token was already produced. Closing or cancelling the consumer closes the
upstream HTTP stream, so the engine stops generating and frees its slot: always
iterate with `contextlib.aclosing(stream_chat(...))` or consume to the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

import httpx2
import openai
import orjson

from core.loops import PerLoop
from inference_ops import admission, admission_gate
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
    # Out of the repr: a local endpoint's key is the one its engines require (engine_keys).
    api_key: str = field(default="", repr=False)
    connect_timeout: float = 3.0
    first_token_timeout: float = 30.0
    idle_timeout: float = 15.0
    total_timeout: float = 300.0
    max_concurrency: int = 64
    capacity: int | None = None  # all processes together (inference_ops.admission); None: no limit
    # An engine of the endpoint runs vLLM's priority scheduling: requests carry their class.
    priority_scheduling: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    # Retries before the first token, the pipeline's (routing.pipeline): how many, and the
    # backoff's base and cap in seconds.
    retries: int = 2
    retry_base: float = 0.25
    retry_cap: float = 2.0

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
            capacity=endpoint.capacity,
            headers=tuple(
                sorted((str(k), str(v)) for k, v in (endpoint.extra_headers or {}).items())
            ),
            retries=endpoint.retries,
            retry_base=endpoint.retry_base,
            retry_cap=endpoint.retry_cap,
        )


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # The engine's details, as it sent them: prompt_tokens_details (cached_tokens),
    # completion_tokens_details (reasoning_tokens).
    details: dict = field(default_factory=dict)

    @classmethod
    def of(cls, usage: dict) -> Usage:
        return cls(
            usage["prompt_tokens"],
            usage["completion_tokens"],
            {name: usage[name] for name in _USAGE_DETAILS if usage.get(name)},
        )


_USAGE_DETAILS = ("prompt_tokens_details", "completion_tokens_details")


@dataclass
class Token:
    text: str  # the first choice's content of every chunk that arrived in one network read
    elapsed: float  # seconds since the request started
    chunks: int = 1  # how many of the engine's chunks said something in it
    # The choices of those chunks as the engine sent them, finish reasons taken out, when one
    # held more than the first choice's text (a tool call, logprobs, another choice, a refusal);
    # None otherwise, the common case, which costs nothing more than the text.
    choices: list[dict] | None = None


@dataclass
class Finish:
    finish_reason: str  # the first choice's
    usage: Usage | None
    ttft: float | None  # seconds to the first token
    total: float
    tokens: int  # chunks that said something (text, a tool call's part, logprobs), all reads
    finish_reasons: dict[int, str] = field(default_factory=dict)  # every choice's, by index
    system_fingerprint: str | None = None
    skipped_chunks: int = 0  # unreadable chunks passed over


# A choice of the first index with nothing but text in its delta: relayed as its text alone.
_PLAIN_DELTA = frozenset({"content", "role"})
_PLAIN_CHOICE = frozenset({"index", "delta", "logprobs", "finish_reason", "stop_reason"})
# vLLM 0.32 writes `"token_ids": null` into every chunk: null, it says nothing.
_TEXT_CHOICE = _PLAIN_CHOICE | {"token_ids"}
_EMPTY: dict = {}


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
    max_tokens_field: str = "max_tokens",
    temperature: float | None = None,
    stop: list[str] | None = None,
    fields: Mapping[str, object] | None = None,
    extra_body: dict | None = None,
    extra_headers: dict[str, str] | None = None,
) -> AsyncGenerator[Token | Finish, None]:
    """Yield Token events, then one Finish; raise EngineError on any failure.

    `fields`: the client's own request fields (tools, response_format, logprobs, n, ...), sent as
    they are; the model, the messages, streaming with usage and the token ceiling are this call's.
    A chunk with more than the first choice's text comes back as it was (`Token.choices`).

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
    # Room at the endpoint's capacity, before its clocks start: the wait has its own deadline.
    admitted = (
        await admission_gate.admit(config.name, config.capacity, config.total_timeout)
        if config.capacity
        else None
    )
    started = loop.time()
    first_deadline = started + config.first_token_timeout
    total_deadline = started + config.total_timeout
    produced = False
    response = None
    deadline = None
    count = 0
    body = {
        **(fields or _EMPTY),
        "model": config.model,
        "messages": messages,
        "stream": True,
        **_options(max_tokens, max_tokens_field, temperature, stop),
        **(extra_body or _EMPTY),
    }
    if config.priority_scheduling:
        body["priority"] = admission.rank()
    try:
        response = await open_stream(
            pool,
            config,
            "/chat/completions",
            body,
            until=min(first_deadline, total_deadline),
            extra_headers=extra_headers,
        )
        reads = stream_reads(response)
        said = _ChatChunks(config)
        ttft = None
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
                raise read_timed_out(
                    config, produced=produced, past_total=loop.time() >= total_deadline
                ) from None
            except httpx2.TransportError as exc:
                raise read_broke(config, exc, produced=produced) from exc
            if said.done:
                continue  # read the body to its end, so the connection goes back to the pool
            texts, relayed, failed = said.read(data, produced=produced)
            if texts or relayed:
                # What arrived before a failure in the same read still reaches the caller.
                elapsed = loop.time() - started
                if not produced:
                    produced, ttft = True, elapsed
                    deadline.first_token()
                chunks = len(relayed) if relayed else len(texts)
                count += chunks
                yield Token(text="".join(texts), elapsed=elapsed, chunks=chunks, choices=relayed)
            if failed is not None:
                raise failed
        if not said.finish_reasons:
            raise unfinished(config, produced=produced)
        if admitted is not None:
            # The engine is done with it: the place goes back now, not when the caller, done
            # with its own end of the answer (the stored message, the log), closes this stream.
            admitted.leave()
            admitted = None
        yield Finish(
            finish_reason=said.finish_reasons.get(0) or next(iter(said.finish_reasons.values())),
            usage=said.usage,
            ttft=ttft,
            total=loop.time() - started,
            tokens=count,
            finish_reasons=said.finish_reasons,
            system_fingerprint=said.fingerprint,
            skipped_chunks=said.skipped,
        )
    except EngineError as exc:
        # The chunks that reached the caller before the failure: the tokens an answer continued
        # elsewhere already has (its ceiling there is the rest).
        exc.chunks = count
        raise
    finally:
        if deadline is not None:
            deadline.close()
        try:
            if response is not None:
                await close_stream(pool, response)
        finally:
            if admitted is not None:
                admitted.leave()


class _ChatChunks:
    """What a chat stream's chunks say, a network read at a time: each read's text of the first
    choice (and its choices as sent, when one is more than that text), and over the whole stream
    every choice's finish reason, the usage, the system fingerprint and the end (`[DONE]`). An
    error event is the read's failure, after what came before it; an unreadable chunk is skipped
    and counted."""

    __slots__ = ("config", "events", "finish_reasons", "usage", "fingerprint", "done", "skipped")

    def __init__(self, config: EndpointConfig):
        self.config = config
        self.events = SSEDecoder()
        self.finish_reasons: dict[int, str] = {}
        self.usage: Usage | None = None
        self.fingerprint: str | None = None
        self.done = False
        self.skipped = 0  # unreadable chunks passed over

    def read(
        self, data: bytes, *, produced: bool
    ) -> tuple[list[str], list[dict] | None, EngineError | None]:
        texts: list[str] = []
        # Every choice of this read, kept in case one of them is more than text.
        choices: list[dict] = []
        rich = False
        failed: EngineError | None = None
        for payload in self.events.feed(data):
            if payload == b"[DONE]":
                self.done = True
                break
            try:
                chunk = orjson.loads(payload)
                if "error" in chunk:
                    failed = error_event(
                        self.config, chunk["error"], produced=produced or bool(texts) or rich
                    )
                    break
                if chunk.get("usage"):
                    self.usage = Usage.of(chunk["usage"])
                if self.fingerprint is None:
                    self.fingerprint = chunk.get("system_fingerprint")
                for choice in chunk.get("choices") or ():
                    choices.append(choice)
                    delta = choice.get("delta") or _EMPTY
                    # The first choice's text and nothing more (its role, a finish reason, vLLM
                    # 0.32's null token_ids): nearly every chunk. Inline, the cheap checks first:
                    # this runs per chunk of every stream.
                    if (
                        ("content" in delta if len(delta) == 1 else delta.keys() <= _PLAIN_DELTA)
                        and choice.get("logprobs") is None
                        and not choice.get("index")
                        and choice.get("token_ids") is None
                        and choice.keys() <= _TEXT_CHOICE
                    ):
                        if text := delta.get("content"):
                            texts.append(text)
                        if (reason := choice.get("finish_reason")) is not None:
                            self.finish_reasons[0] = reason
                        continue
                    rich = True
                    index = choice.get("index") or 0
                    if index == 0 and (text := delta.get("content")):
                        texts.append(text)
                    if (reason := choice.get("finish_reason")) is not None:
                        self.finish_reasons[index] = reason
            except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError):
                # One unreadable chunk is skipped, not fatal: the stream's end still has to come
                # (a finish reason), or the answer fails as truncated. Counted for the metrics.
                self.skipped += 1
                continue
        return texts, _relayed(choices) if rich else None, failed


def _relayed(choices: list[dict]) -> list[dict]:
    """The choices to relay, without their finish reasons (the caller ends every choice when the
    answer ends) and without those that said nothing else."""
    relayed = []
    for choice in choices:
        choice.pop("finish_reason", None)
        choice.pop("stop_reason", None)
        if choice.get("logprobs") is not None or _says(choice):
            relayed.append(choice)
    return relayed


def _says(choice: dict) -> bool:
    """Whether a choice holds something beyond its role (checked key by key: a tool call's
    delta answers at its first)."""
    for key, value in (choice.get("delta") or _EMPTY).items():
        if value and key != "role":
            return True
    for key, value in choice.items():
        if value and key not in _PLAIN_CHOICE:
            return True
    return False


def _options(
    max_tokens: int | None, max_tokens_field: str, temperature: float | None, stop: list[str] | None
) -> dict:
    options: dict = {"stream_options": {"include_usage": True}}
    if max_tokens is not None:
        options[max_tokens_field] = max_tokens
    if temperature is not None:
        options["temperature"] = temperature
    if stop:
        options["stop"] = stop
    return options


# --- what every streamed call shares (stream_chat here, other_apis.stream_completion) -------------


async def open_stream(
    pool: _Pool,
    config: EndpointConfig,
    path: str,
    body: dict,
    *,
    until: float,
    extra_headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """Take one of the endpoint's slots and send a streamed request, both by `until` (the loop's
    clock): the response, its slot held until `close_stream`; or EngineError, the slot given
    back."""
    acquired = False
    try:
        try:
            async with asyncio.timeout_at(until):
                await pool.slots.acquire()
                acquired = True
                return await pool.client.post(
                    path,
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
    except BaseException:
        if acquired:
            pool.slots.release()
        raise


def stream_reads(response: httpx2.Response):
    """The response's bytes a network read at a time: raw unless the engine compressed the
    stream (one generator layer less per read)."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    return response.aiter_bytes() if encoding not in ("", "identity") else response.aiter_raw()


async def close_stream(pool: _Pool, response: httpx2.Response) -> None:
    """Closing the response tells the engine the client is gone (vLLM aborts the request); its
    slot goes back."""
    try:
        await response.aclose()
    finally:
        pool.slots.release()


def read_timed_out(config: EndpointConfig, *, produced: bool, past_total: bool) -> EngineError:
    if past_total:
        kind, what = "timeout_total", f"the request took longer than {config.total_timeout:g}s"
    elif produced:
        kind, what = "timeout_idle", f"no token for {config.idle_timeout:g}s"
    else:
        kind, what = "timeout_first_token", f"no first token in {config.first_token_timeout:g}s"
    return EngineError(kind, what, produced_tokens=produced, endpoint=config.name)


def read_broke(config: EndpointConfig, exc: Exception, *, produced: bool) -> EngineError:
    return EngineError(
        "stream_truncated",
        f"the connection broke: {exc}",
        produced_tokens=produced,
        endpoint=config.name,
    )


def error_event(config: EndpointConfig, error, *, produced: bool) -> EngineError:
    """An error event inside the stream (vLLM's, after its 200)."""
    message = error.get("message") if isinstance(error, dict) else error
    return EngineError(
        "stream_error",
        f"error in the stream: {message}",
        produced_tokens=produced,
        endpoint=config.name,
    )


def unreadable_chunk(config: EndpointConfig, exc: Exception, *, produced: bool) -> EngineError:
    return EngineError(
        "malformed", f"unreadable chunk: {exc}", produced_tokens=produced, endpoint=config.name
    )


def unfinished(config: EndpointConfig, *, produced: bool) -> EngineError:
    return EngineError(
        "stream_truncated",
        "the stream ended without a finish reason",
        produced_tokens=produced,
        endpoint=config.name,
    )
