"""The engine's other two /v1 APIs beside chat: OpenAI's legacy completions (a raw prompt,
streamed) and embeddings, through the same per-endpoint pool, slots, deadlines and typed failures
as `client.stream_chat`.

`stream_completion` is `stream_chat`'s driver (`client.stream_events`) with its own reading of the
chunks (`_CompletionChunks`), so it yields the same `Token` and `Finish` events: a token's text is
the first choice's `text`; a chunk with more (logprobs, another choice, token ids, an echoed
prompt's logprobs) comes back as the engine's own choice objects. `create_embeddings` is one call
of the SDK's `embeddings.create`, bounded as a stream's first token is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

import orjson

from inference_ops.client import Finish, Token, Usage, request_options, stream_events
from inference_ops.endpoint_calls import EndpointConfig, error_event, pool_for, unreadable_chunk
from inference_ops.exceptions import EngineError
from inference_ops.sdk_errors import SDK_ERRORS, engine_error_from_sdk
from inference_ops.sse import SSEDecoder

_EMPTY: dict = {}
# A completion choice that says nothing but the first choice's text: relayed as its text alone.
_PLAIN = frozenset({"index", "text", "finish_reason", "stop_reason"})


def stream_completion(
    config: EndpointConfig,
    prompt: str | list,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    fields: Mapping[str, object] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> AsyncGenerator[Token | Finish, None]:
    """Yield Token events, then one Finish; raise EngineError on any failure (through
    `stream_chat`'s driver, `client.stream_events`). `fields`: the client's own (n, logprobs,
    echo, suffix, stop, vLLM's sampling...), sent as they are; the model, the prompt, streaming
    with usage and the token ceiling are this call's. Iterate with `contextlib.aclosing`: closing
    it closes the engine's stream."""
    body = {
        **(fields or _EMPTY),
        "model": config.model,
        "prompt": prompt,
        "stream": True,
        **request_options(max_tokens, "max_tokens", temperature, None),
    }
    return stream_events(
        config, "/completions", body, _CompletionChunks(config), extra_headers=extra_headers
    )


class _CompletionChunks:
    """What a completion stream's chunks say, a network read at a time (`client.Chunks`): each
    read's text of the first choice, every choice of the read as sent when one is more than that
    text, and over the whole stream every choice's finish reason, the usage, the system
    fingerprint and the end (`[DONE]`). An error event or an unreadable chunk is the read's
    failure, after what came before it."""

    __slots__ = ("config", "done", "events", "fingerprint", "finish_reasons", "skipped", "usage")

    def __init__(self, config: EndpointConfig):
        self.config = config
        self.events = SSEDecoder()
        self.finish_reasons: dict[int, str] = {}
        self.usage: Usage | None = None
        self.fingerprint: str | None = None
        self.done = False
        self.skipped = 0  # never more: an unreadable chunk fails the stream

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
                    index = choice.get("index") or 0
                    if index == 0 and (text := choice.get("text")):
                        texts.append(text)
                    if (reason := choice.get("finish_reason")) is not None:
                        self.finish_reasons[index] = reason
                    choices.append(choice)
                    # vLLM names every field of its choice, null when unused (logprobs,
                    # token_ids, ...).
                    rich = (
                        rich
                        or index != 0
                        or any(
                            value is not None for key, value in choice.items() if key not in _PLAIN
                        )
                    )
            except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError) as exc:
                failed = unreadable_chunk(
                    self.config, exc, produced=produced or bool(texts) or rich
                )
                break
        # The read's count: every choice in it, those that said nothing included.
        return texts, _relayed(choices) if rich else None, len(choices), failed


def _relayed(choices: list[dict]) -> list[dict]:
    """The choices to relay, without their finish reasons (the caller ends every choice when the
    answer ends) and without those that said nothing else."""
    relayed = []
    for choice in choices:
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
