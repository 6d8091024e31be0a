"""A raw completion's events as OpenAI's `text_completion`: server-sent chunks as the tokens come,
or one JSON body at the end.

What the engine answered comes back as it said it: each choice's text, its logprobs (tokens, their
offsets and alternatives), several choices by index, vLLM's token ids. A chunk of the first
choice's text alone (the common case) is written from a template with only its text encoded;
anything richer is relayed as the engine's own choice objects, under the gateway's id and model.
Every choice ends with the gateway's finish chunk when the answer is whole: a stream that fails
says so instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import orjson

from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    failure_reply,
    pipeline_error_event,
    pipeline_error_reply,
    stream_error_event,
)
from routing import events

PATH = "/v1/completions"


@dataclass(frozen=True)
class Answer:
    """What names the answer in each of its chunks or its body."""

    completion_id: str
    created: int
    model: str

    def chunk(
        self,
        choices: list[dict],
        *,
        usage: dict | None = None,
        fingerprint: str | None = None,
        overhead: float | None = None,
    ) -> str:
        body: dict = {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if fingerprint is not None:
            body["system_fingerprint"] = fingerprint
        if usage is not None or not choices:
            body["usage"] = usage
        if overhead is not None:
            body["gateway_overhead_ms"] = overhead
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _choice(index: int, text: str = "", finish: str | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def _usage(done: events.Done) -> dict:
    return done.usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


async def completion_stream(
    call: AsyncGenerator[events.Event, None], answer: Answer, *, include_usage: bool, user
) -> AsyncGenerator[str | bytes, None]:
    # A text chunk is the same JSON but for its text: built from two halves, one dumps a token.
    head, tail = (
        part.encode() for part in answer.chunk([_choice(0, "\x00")]).split(json.dumps("\x00"))
    )
    # A relayed chunk: the same JSON up to its choices, the engine's choice in them.
    relay_head = (answer.chunk([]).split('"choices": []')[0] + '"choices": [').encode()
    try:
        async for event in call:
            if isinstance(event, events.Token):
                if event.choices is None:
                    yield head + orjson.dumps(event.text) + tail
                else:
                    yield b"".join(
                        relay_head + orjson.dumps(choice) + b"]}\n\n" for choice in event.choices
                    )
            elif isinstance(event, events.Done):
                ends = sorted((event.finish_reasons or {0: event.finish_reason}).items())
                end = "".join(
                    answer.chunk(
                        [_choice(index, finish=reason)],
                        fingerprint=event.system_fingerprint,
                        overhead=event.overhead_ms if number == len(ends) - 1 else None,
                    )
                    for number, (index, reason) in enumerate(ends)
                )
                if include_usage:
                    end += answer.chunk(
                        [], usage=_usage(event), fingerprint=event.system_fingerprint
                    )
                yield end + "data: [DONE]\n\n"
            elif isinstance(event, events.Error):
                yield await pipeline_error_event(event, user)
    except Exception as exc:  # noqa: BLE001 - the failure is the stream's last event
        yield stream_error_event(failure_reply(exc, method="POST", path=PATH).body["error"])  # type: ignore[index]  # a failure reply has a body
    finally:
        await call.aclose()


class _Choices:
    """The choices of a streamed answer put together, as a whole completion has them."""

    def __init__(self):
        self.by_index: dict[int, dict] = {}

    def _of(self, index: int) -> dict:
        return self.by_index.setdefault(index, {"text": [], "logprobs": None, "other": {}})

    def text(self, text: str) -> None:
        self._of(0)["text"].append(text)

    def add(self, choices: list[dict]) -> None:
        for choice in choices:
            into = self._of(choice.get("index") or 0)
            for key, value in choice.items():
                if key == "index" or value is None:
                    continue
                if key == "text":
                    into["text"].append(value)
                elif key == "logprobs":
                    # Each of its lists (tokens, their logprobs, offsets, alternatives) goes on.
                    merged = into["logprobs"] = into["logprobs"] or {}
                    for name, entries in value.items():
                        merged.setdefault(name, []).extend(entries or ())
                elif key == "token_ids" and isinstance(value, list):
                    into["other"].setdefault(key, []).extend(value)
                else:
                    into["other"].setdefault(key, value)

    def choices_of(self, done: events.Done) -> list[dict]:
        reasons = done.finish_reasons or {0: done.finish_reason}
        for index in reasons:
            self._of(index)
        return [
            {
                **_choice(index, "".join(parts["text"]), reasons.get(index, done.finish_reason)),
                "logprobs": parts["logprobs"],
                **parts["other"],
            }
            for index, parts in sorted(self.by_index.items())
        ]


async def completion_body(
    call: AsyncGenerator[events.Event, None], answer: Answer, *, user
) -> Reply:
    choices, done, error = _Choices(), None, None
    try:
        async for event in call:
            if isinstance(event, events.Token):
                if event.choices is None:
                    choices.text(event.text)
                else:
                    choices.add(event.choices)
            elif isinstance(event, events.Done):
                done = event
            elif isinstance(event, events.Error):
                error = event
    finally:
        await call.aclose()
    if error is not None or done is None:
        assert error is not None
        return await pipeline_error_reply(error, user)
    body = {
        "id": answer.completion_id,
        "object": "text_completion",
        "created": answer.created,
        "model": answer.model,
        "choices": choices.choices_of(done),
        "usage": _usage(done),
    }
    if done.system_fingerprint is not None:
        body["system_fingerprint"] = done.system_fingerprint
    return Reply(200, headers={OVERHEAD_HEADER: f"{done.overhead_ms:.1f}"}, body=body)
