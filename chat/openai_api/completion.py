"""A turn's events as OpenAI's chat completion: server-sent chunks as the tokens come, or one
JSON body at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import orjson

from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    error_message_for,
    failure_reply,
    pipeline_error_reply,
)
from routing import events


def _chunk(
    completion_id, created, model, delta=None, finish=None, usage=None, choices=True, overhead=None
) -> str:
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else [],
    }
    if usage is not None or not choices:
        body["usage"] = usage
    if overhead is not None:
        body["gateway_overhead_ms"] = overhead
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _error_event(error: dict) -> str:
    """The stream's last event when it fails: the headers are out, a status can no longer say it."""
    return f"data: {json.dumps({'error': error}, ensure_ascii=False)}\n\ndata: [DONE]\n\n"


async def completion_stream(
    *, turn, completion_id: str, created: int, model: str, include_usage: bool, user
) -> AsyncIterator[str | bytes]:
    # A token chunk is the same JSON but for its text: built from two halves, one dumps a token.
    head, tail = (
        part.encode()
        for part in _chunk(completion_id, created, model, delta={"content": "\x00"}).split(
            json.dumps("\x00")
        )
    )
    try:
        yield _chunk(completion_id, created, model, delta={"role": "assistant", "content": ""})
        async for event in turn:
            if isinstance(event, events.Token):
                yield head + orjson.dumps(event.text) + tail
            elif isinstance(event, events.Done):
                end = _chunk(
                    completion_id,
                    created,
                    model,
                    finish=event.finish_reason,
                    overhead=event.overhead_ms,
                )
                if include_usage:
                    end += _chunk(
                        completion_id,
                        created,
                        model,
                        usage=event.usage or _zero_usage(),
                        choices=False,
                    )
                yield end + "data: [DONE]\n\n"
            elif isinstance(event, events.Error):
                yield _error_event(
                    {
                        "message": await error_message_for(event, user),
                        "type": "api_error",
                        "param": None,
                        "code": event.code,
                    }
                )
    except Exception as exc:  # noqa: BLE001 - the failure is the stream's last event
        failure = failure_reply(exc, method="POST", path="/v1/chat/completions")
        yield _error_event(failure.body["error"])
    finally:
        await turn.aclose()


def _zero_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


async def completion_body(*, turn, completion_id: str, created: int, model: str, user) -> Reply:
    parts, done, error = [], None, None
    async for event in turn:
        if isinstance(event, events.Token):
            parts.append(event.text)
        elif isinstance(event, events.Done):
            done = event
        elif isinstance(event, events.Error):
            error = event
    if error is not None:
        return await pipeline_error_reply(error, user)
    return Reply(
        200,
        headers={OVERHEAD_HEADER: f"{done.overhead_ms:.1f}"},
        body={
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "finish_reason": done.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": done.usage or _zero_usage(),
        },
    )
