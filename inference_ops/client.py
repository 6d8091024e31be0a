"""Streaming chat completions from any OpenAI-compatible engine, through the official SDK.

One driver streams every API that streams (`stream_events`: the admission, the deadlines, the
reads, the events and the close); each API reads its own chunks (`Chunks`: chat's here,
completions' in `inference_ops.other_apis`). One pooled `AsyncOpenAI` per endpoint (and event
loop) is reused across requests (`inference_ops.endpoint_calls`, with what every streamed call
shares). Every failure becomes one `EngineError` with a kind, `retryable`, and whether a token was
already produced. Closing or cancelling the consumer closes the upstream HTTP stream, so the engine
stops generating and frees its slot: always iterate with `contextlib.aclosing(stream_chat(...))`
or consume to the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx2
import orjson

from inference_ops import admission, admission_gate
from inference_ops.endpoint_calls import (
    EndpointConfig,
    close_stream,
    error_event,
    open_stream,
    pool_for,
    read_broke,
    read_timed_out,
    stream_reads,
    unfinished,
)
from inference_ops.exceptions import EngineError
from inference_ops.sse import SSEDecoder
from inference_ops.stream_deadline import StreamDeadline


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


def stream_chat(
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
    """Yield Token events, then one Finish; raise EngineError on any failure (`stream_events`).

    `fields`: the client's own request fields (tools, response_format, logprobs, n, ...), sent as
    they are; the model, the messages, streaming with usage and the token ceiling are this call's.
    A chunk with more than the first choice's text comes back as it was (`Token.choices`).

    A plain function that returns the driver's generator, not a generator of its own: a layer
    around it would cost a resumption per token. Nothing is sent before the first iteration.
    """
    body = {
        **(fields or _EMPTY),
        "model": config.model,
        "messages": messages,
        "stream": True,
        **request_options(max_tokens, max_tokens_field, temperature, stop),
        **(extra_body or _EMPTY),
    }
    if config.priority_scheduling:
        body["priority"] = admission.rank()
    return stream_events(
        config, "/chat/completions", body, _ChatChunks(config), extra_headers=extra_headers
    )


class Chunks(Protocol):
    """What a stream's chunks say, a network read at a time (`_ChatChunks`, and
    `other_apis._CompletionChunks` for completions). `read` returns the first choice's texts of
    the read, its choices as the engine sent them when one held more than that text (else None),
    how many chunks said something, and the failure that ended the read (after what came before
    it). Over the whole stream: every choice's finish reason, the usage, the system fingerprint,
    the unreadable chunks skipped, and whether the end (`[DONE]`) came."""

    done: bool
    finish_reasons: dict[int, str]
    usage: Usage | None
    fingerprint: str | None
    skipped: int

    def read(
        self, data: bytes, *, produced: bool
    ) -> tuple[list[str], list[dict] | None, int, EngineError | None]: ...


async def stream_events(
    config: EndpointConfig,
    path: str,
    body: dict,
    said: Chunks,
    *,
    extra_headers: dict[str, str] | None = None,
) -> AsyncGenerator[Token | Finish, None]:
    """Stream `body` from the endpoint's `path` and yield Token events, then one Finish; raise
    EngineError on any failure, its `chunks` the chunks that reached the caller before it. The
    driver of every streamed API (`stream_chat`, `other_apis.stream_completion`); `said` reads
    their chunks.

    The SDK sends the request (`client.post`, the SDK's documented way to a raw response: its
    typed `create` walks every message through its TypedDict annotations, which under load
    cost more than the rest of the request); the response's server-sent events are read raw,
    a network read at a time, and the content of every chunk in one read leaves as one Token.
    Per-chunk work is one `orjson.loads`: the SDK would build a pydantic model per chunk, and
    under load a read holds many chunks, which then cost the layers above one event instead of
    many. The timeouts are one timer per stream (`StreamDeadline`), not one per read.
    """
    pool = pool_for(config)
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
    try:
        response = await open_stream(
            pool,
            config,
            path,
            body,
            until=min(first_deadline, total_deadline),
            extra_headers=extra_headers,
        )
        reads = stream_reads(response)
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
            texts, relayed, chunks, failed = said.read(data, produced=produced)
            if texts or relayed:
                # What arrived before a failure in the same read still reaches the caller.
                elapsed = loop.time() - started
                if not produced:
                    produced, ttft = True, elapsed
                    deadline.first_token()
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

    __slots__ = ("config", "done", "events", "fingerprint", "finish_reasons", "skipped", "usage")

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
    ) -> tuple[list[str], list[dict] | None, int, EngineError | None]:
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
        if not rich:
            return texts, None, len(texts), failed
        relayed = _relayed(choices)
        return texts, relayed, len(relayed) if relayed else len(texts), failed


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


def request_options(
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
