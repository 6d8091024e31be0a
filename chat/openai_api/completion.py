"""A turn's events as OpenAI's chat completion: server-sent chunks as the tokens come, or one
JSON body at the end.

What the engine answered comes back as it said it: text, tool-call deltas with their indices,
ids and argument fragments, logprobs, several choices, a refusal, its usage details. A chunk of
the first choice's text alone (the common case) is written from a template with only its text
encoded; anything richer is relayed as the engine's own choice objects. Every choice ends with the
gateway's finish chunk when the answer is whole: a stream that fails says so instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

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

CONTINUED_HEADER = "X-Route-Continued"


def _chunk(
    completion_id,
    created,
    model,
    delta=None,
    finish=None,
    usage=None,
    choices=True,
    overhead=None,
    index=0,
    fingerprint=None,
    continued=(),
) -> str:
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": (
            [{"index": index, "delta": delta or {}, "finish_reason": finish}] if choices else []
        ),
    }
    if fingerprint is not None:
        body["system_fingerprint"] = fingerprint
    if usage is not None or not choices:
        body["usage"] = usage
    if overhead is not None:
        body["gateway_overhead_ms"] = overhead
    if continued:
        # The answer's stream broke mid-answer and these endpoints went on with it.
        body["gateway_continued"] = list(continued)
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def completion_stream(
    *,
    turn,
    completion_id: str,
    created: int,
    model: str,
    include_usage: bool,
    user,
    choices: int = 1,
) -> AsyncGenerator[str | bytes, None]:
    # A token chunk is the same JSON but for its text: built from two halves, one dumps a token.
    head, tail = (
        part.encode()
        for part in _chunk(completion_id, created, model, delta={"content": "\x00"}).split(
            json.dumps("\x00")
        )
    )
    # A relayed chunk: the same JSON up to its choices, the engine's choice in them.
    opening = _chunk(completion_id, created, model, choices=False).split('"choices": []')[0]
    relay_head = (opening + '"choices": [').encode()
    try:
        yield "".join(
            _chunk(
                completion_id, created, model, delta={"role": "assistant", "content": ""}, index=i
            )
            for i in range(choices)
        )
        async for event in turn:
            if isinstance(event, events.Token):
                if event.choices is None:
                    yield head + orjson.dumps(event.text) + tail
                else:
                    yield b"".join(
                        relay_head + orjson.dumps(choice) + b"]}\n\n" for choice in event.choices
                    )
            elif isinstance(event, events.Done):
                reasons = event.finish_reasons or {0: event.finish_reason}
                ends = sorted(reasons.items())
                end = "".join(
                    _chunk(
                        completion_id,
                        created,
                        model,
                        index=index,
                        finish=reason,
                        fingerprint=event.system_fingerprint,
                        overhead=event.overhead_ms if number == len(ends) - 1 else None,
                        continued=event.continued if number == len(ends) - 1 else (),
                    )
                    for number, (index, reason) in enumerate(ends)
                )
                if include_usage:
                    end += _chunk(
                        completion_id,
                        created,
                        model,
                        usage=event.usage or _zero_usage(),
                        choices=False,
                        fingerprint=event.system_fingerprint,
                    )
                yield end + "data: [DONE]\n\n"
            elif isinstance(event, events.Error):
                yield await pipeline_error_event(event, user)
    except Exception as exc:  # noqa: BLE001 - the failure is the stream's last event
        failure = failure_reply(exc, method="POST", path="/v1/chat/completions")
        yield stream_error_event(failure.body["error"])  # type: ignore[index]  # a failure reply has a body
    finally:
        await turn.aclose()


def _zero_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


class _Answer:
    """The choices of a streamed answer put together, as a non-streamed completion has them."""

    def __init__(self, choices: int):
        self.choices: dict[int, dict] = {index: _new_choice() for index in range(choices)}

    def text(self, text: str) -> None:
        self.choices[0]["content"].append(text)

    def add(self, choices: list[dict]) -> None:
        for choice in choices:
            into = self.choices.setdefault(choice.get("index") or 0, _new_choice())
            for key, value in (choice.get("delta") or {}).items():
                if key == "role" or value is None:
                    continue
                if key == "tool_calls":
                    for call in value:
                        _add_call(into["tool_calls"], call)
                elif isinstance(value, str):
                    into.setdefault(key, []).append(value)
                else:
                    into["other"][key] = value
            logprobs = choice.get("logprobs")
            if logprobs:
                for key, entries in logprobs.items():
                    into["logprobs"].setdefault(key, []).extend(entries or ())

    def choices_of(self, done: events.Done) -> list[dict]:
        reasons = done.finish_reasons or {0: done.finish_reason}
        return [
            _choice(index, parts, reasons.get(index, done.finish_reason))
            for index, parts in sorted(self.choices.items())
        ]


def _new_choice() -> dict:
    return {"content": [], "tool_calls": {}, "logprobs": {}, "other": {}}


def _add_call(calls: dict[int, dict], delta: dict) -> None:
    """One tool-call delta into the calls so far: the id, type and name once, the arguments in
    fragments."""
    call = calls.setdefault(
        delta.get("index") or 0,
        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _choice(index: int, parts: dict, finish_reason: str) -> dict:
    calls = [parts["tool_calls"][number] for number in sorted(parts["tool_calls"])]
    content = "".join(parts["content"])
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
        "refusal": "".join(parts["refusal"]) if "refusal" in parts else None,
    }
    if calls:
        message["tool_calls"] = calls
    for key, value in parts.items():
        if key not in ("content", "tool_calls", "logprobs", "other", "refusal"):
            message[key] = "".join(value)  # e.g. reasoning_content
    message.update(parts["other"])
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": parts["logprobs"] or None,
    }


async def completion_body(
    *, turn, completion_id: str, created: int, model: str, user, choices: int = 1
) -> Reply:
    answer, done, error = _Answer(choices), None, None
    async for event in turn:
        if isinstance(event, events.Token):
            if event.choices is None:
                answer.text(event.text)
            else:
                answer.add(event.choices)
        elif isinstance(event, events.Done):
            done = event
        elif isinstance(event, events.Error):
            error = event
    if error is not None:
        return await pipeline_error_reply(error, user)
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": answer.choices_of(done),  # type: ignore[arg-type]  # no Error: the stream ended Done
        "usage": done.usage or _zero_usage(),  # type: ignore[union-attr]  # no Error: the stream ended Done
    }
    if done.system_fingerprint is not None:  # type: ignore[union-attr]  # no Error: the stream ended Done
        body["system_fingerprint"] = done.system_fingerprint  # type: ignore[union-attr]  # no Error: the stream ended Done
    headers = {OVERHEAD_HEADER: f"{done.overhead_ms:.1f}"}  # type: ignore[union-attr]  # no Error: the stream ended Done
    if done.continued:  # type: ignore[union-attr]  # no Error: the stream ended Done
        # The answer's stream broke mid-answer and these endpoints went on with it; the route
        # headers name the one that finished it.
        headers[CONTINUED_HEADER] = ", ".join(done.continued)  # type: ignore[union-attr]  # no Error: the stream ended Done
        headers["X-Route-Target"] = done.target or ""  # type: ignore[union-attr]  # no Error: the stream ended Done
    return Reply(200, headers=headers, body=body)
