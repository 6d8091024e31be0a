"""The engine's other two /v1 APIs beside chat: OpenAI's legacy completions (a raw prompt,
streamed) and embeddings, through the same per-endpoint pool, slots, deadlines and typed failures
as `client.stream_chat`.

`stream_completion` yields the same `Token` and `Finish` events as `stream_chat`: a token's text is
the first choice's `text`; a chunk with more (logprobs, another choice, token ids, an echoed
prompt's logprobs) comes back as the engine's own choice objects. `create_embeddings` is one call
of the SDK's `embeddings.create`, bounded as a stream's first token is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

import httpx2
import orjson

from inference_ops import admission_gate
from inference_ops.client import Finish, Token, Usage, request_options
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
    unreadable_chunk,
)
from inference_ops.exceptions import EngineError
from inference_ops.sdk_errors import SDK_ERRORS, engine_error_from_sdk
from inference_ops.sse import SSEDecoder
from inference_ops.stream_deadline import StreamDeadline

_EMPTY: dict = {}
# A completion choice that says nothing but the first choice's text: relayed as its text alone.
_PLAIN = frozenset({"index", "text", "finish_reason", "stop_reason"})


async def stream_completion(
    config: EndpointConfig,
    prompt: str | list,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    fields: Mapping[str, object] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> AsyncGenerator[Token | Finish, None]:
    """Yield Token events, then one Finish; raise EngineError on any failure. `fields`: the
    client's own (n, logprobs, echo, suffix, stop, vLLM's sampling...), sent as they are; the
    model, the prompt, streaming with usage and the token ceiling are this call's. Iterate with
    `contextlib.aclosing`: closing it closes the engine's stream."""
    pool = pool_for(config)
    loop = asyncio.get_running_loop()
    admitted = (
        await admission_gate.admit(config.name, config.capacity, config.total_timeout)
        if config.capacity
        else None
    )
    started = loop.time()
    first_deadline = min(started + config.first_token_timeout, started + config.total_timeout)
    total_deadline = started + config.total_timeout
    body = {
        **(fields or _EMPTY),
        "model": config.model,
        "prompt": prompt,
        "stream": True,
        **request_options(max_tokens, "max_tokens", temperature, None),
    }
    produced = False
    response = None
    deadline = None
    try:
        response = await open_stream(
            pool, config, "/completions", body, until=first_deadline, extra_headers=extra_headers
        )
        reads = stream_reads(response)
        events = SSEDecoder()
        deadline = StreamDeadline(
            loop, first=first_deadline, total=total_deadline, idle=config.idle_timeout
        )
        finish_reasons: dict[int, str] = {}
        usage, ttft, count, done, fingerprint = None, None, 0, False, None
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
            if done:
                continue  # read the body to its end, so the connection goes back to the pool
            read = _Read()
            for payload in events.feed(data):
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    chunk = orjson.loads(payload)
                    if "error" in chunk:
                        read.failed = error_event(
                            config, chunk["error"], produced=produced or read.said
                        )
                        break
                    if chunk.get("usage"):
                        usage = Usage.of(chunk["usage"])
                    if fingerprint is None:
                        fingerprint = chunk.get("system_fingerprint")
                    for choice in chunk.get("choices") or ():
                        read.add(choice, finish_reasons)
                except (
                    orjson.JSONDecodeError,
                    ValueError,
                    TypeError,
                    AttributeError,
                    KeyError,
                ) as exc:
                    read.failed = unreadable_chunk(config, exc, produced=produced or read.said)
                    break
            relayed = read.relayed()
            if read.texts or relayed:
                # What arrived before a failure in the same read still reaches the caller.
                elapsed = loop.time() - started
                if not produced:
                    produced, ttft = True, elapsed
                    deadline.first_token()
                count += len(read.choices)
                yield Token(
                    text="".join(read.texts),
                    elapsed=elapsed,
                    chunks=len(read.choices),
                    choices=relayed,
                )
            if read.failed is not None:
                raise read.failed
        if not finish_reasons:
            raise unfinished(config, produced=produced)
        if admitted is not None:
            # The engine is done with it: the place goes back now, not when the caller, done
            # with its own end of the answer (the stored message, the log), closes this stream.
            admitted.leave()
            admitted = None
        yield Finish(
            finish_reason=finish_reasons.get(0) or next(iter(finish_reasons.values())),
            usage=usage,
            ttft=ttft,
            total=loop.time() - started,
            tokens=count,
            finish_reasons=finish_reasons,
            system_fingerprint=fingerprint,
        )
    finally:
        if deadline is not None:
            deadline.close()
        try:
            if response is not None:
                await close_stream(pool, response)
        finally:
            if admitted is not None:
                admitted.leave()


class _Read:
    """The choices of one network read: the first choice's text, and every choice kept in case
    one of them is more than text."""

    __slots__ = ("choices", "failed", "rich", "texts")

    def __init__(self):
        self.texts: list[str] = []
        self.choices: list[dict] = []
        self.rich = False
        self.failed: EngineError | None = None

    @property
    def said(self) -> bool:
        return bool(self.texts) or self.rich

    def add(self, choice: dict, finish_reasons: dict[int, str]) -> None:
        index = choice.get("index") or 0
        if index == 0 and (text := choice.get("text")):
            self.texts.append(text)
        if (reason := choice.get("finish_reason")) is not None:
            finish_reasons[index] = reason
        self.choices.append(choice)
        # vLLM names every field of its choice, null when unused (logprobs, token_ids, ...).
        self.rich = (
            self.rich
            or index != 0
            or any(value is not None for key, value in choice.items() if key not in _PLAIN)
        )

    def relayed(self) -> list[dict] | None:
        """The choices to relay when one held more than the first choice's text, without their
        finish reasons (the caller ends every choice when the answer ends) and without those that
        said nothing else; None otherwise."""
        if not self.rich:
            return None
        relayed = []
        for choice in self.choices:
            choice.pop("finish_reason", None)
            choice.pop("stop_reason", None)
            if choice.get("text") or any(
                value is not None for key, value in choice.items() if key not in _PLAIN
            ):
                relayed.append(choice)
        return relayed


@dataclass
class Embeddings:
    """An engine's embeddings: one per input in order, as floats or base64 strings (the encoding
    asked for), and the tokens it counted."""

    vectors: list[list[float] | str]
    prompt_tokens: int | None
    seconds: float  # the engine's time, request to answer


async def create_embeddings(
    config: EndpointConfig,
    inputs: str | list,
    *,
    encoding_format: str,
    fields: Mapping[str, object] | None = None,
) -> Embeddings:
    """One embeddings call through the endpoint's pool: a slot and the answer by the endpoint's
    first-token deadline (an embedding is answered whole, as a first token is). `fields`: the
    client's own (dimensions, user, vLLM's extras), sent as they are. Raises EngineError."""
    pool = pool_for(config)
    loop = asyncio.get_running_loop()
    started = loop.time()
    until = started + min(config.first_token_timeout, config.total_timeout)
    fields = dict(fields or _EMPTY)
    dimensions = fields.pop("dimensions", None)
    user = fields.pop("user", None)
    acquired = False
    try:
        async with asyncio.timeout_at(until):
            await pool.slots.acquire()
            acquired = True
            response = await pool.client.embeddings.create(
                model=config.model,
                input=inputs,
                encoding_format=encoding_format,  # type: ignore[arg-type]
                **({"dimensions": dimensions} if dimensions is not None else {}),  # type: ignore[arg-type]  # each value checked above
                **({"user": user} if user is not None else {}),  # type: ignore[arg-type]  # each value checked above
                extra_body=fields or None,
            )
    except TimeoutError:
        what = (
            f"no embeddings in {until - started:g}s"
            if acquired
            else f"all {config.max_concurrency} slots stayed busy"
        )
        raise EngineError("timeout_first_token", what, endpoint=config.name) from None
    except SDK_ERRORS as exc:
        raise engine_error_from_sdk(
            exc, produced=False, during_request=True, endpoint=config.name
        ) from exc
    finally:
        if acquired:
            pool.slots.release()
    try:
        data = sorted(response.data, key=lambda item: item.index)
        vectors = [item.embedding for item in data]
        usage = response.usage
        prompt_tokens = usage.prompt_tokens if usage is not None else None
    except (AttributeError, TypeError, ValueError) as exc:
        raise EngineError(
            "malformed", f"unreadable embeddings: {exc}", endpoint=config.name
        ) from exc
    count = len(inputs) if isinstance(inputs, list) and not _token_ids(inputs) else 1
    if len(vectors) != count:
        raise EngineError(
            "malformed",
            f"{len(vectors)} embeddings for {count} inputs",
            endpoint=config.name,
        )
    return Embeddings(vectors=vectors, prompt_tokens=prompt_tokens, seconds=loop.time() - started)  # type: ignore[arg-type]  # list is invariant: floats here


def _token_ids(inputs: list) -> bool:
    """One input of token ids (rather than a list of inputs)."""
    return bool(inputs) and all(isinstance(item, int) for item in inputs)
