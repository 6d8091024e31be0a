"""`POST /v1/completions`: OpenAI's legacy completions, a raw prompt completed by a model.

The request is read as the chat request is (chat.openai_api.schema): every field of OpenAI's
request and vLLM's own is known (inference_ops.openai_fields, its COMPLETION_ tables); the ones the
gateway owns are read (the model, the prompt, the token ceiling, streaming), the others checked
for their type and passed on as sent, or refused with a 400 that names them. The call is routed by
routing.completions.complete (the rules, no knowledge base) and answered by text_completion.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from chat.exceptions import RateLimited
from chat.openai_api import text_completion
from chat.openai_api.calls import run_call
from chat.openai_api.handlers import authenticate
from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    error_reply,
    overhead_header,
    pipeline_error_reply,
    route_headers,
)
from chat.openai_api.schema import MAX_CHOICES, MAX_STOPS, request_fields
from core.text import text_problem
from inference_ops import openai_fields
from observability.models import RequestLog
from routing import events
from routing.completions import complete

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs; OpenAI's own limit is 5

_Tokens = Annotated[StrictInt, Field(ge=1, le=32768)]
_Number = StrictFloat | StrictInt


def _ranged(low: float, high: float):
    return Annotated[_Number, Field(ge=low, le=high)]


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    include_obfuscation: Literal[False] = False
    continuous_usage_stats: StrictBool = False  # vLLM's: refused below, usage is the gateway's


class _Body(BaseModel):
    """The fields whose types the gateway checks; the prompt is read by `_prompt`, vLLM's other
    fields by vLLM (its 400 comes back as one)."""

    model_config = ConfigDict(extra="allow")
    model: Annotated[StrictStr, Field(min_length=1)]
    prompt: Any = None
    max_tokens: _Tokens | None = None
    stream: StrictBool | None = None
    stream_options: _StreamOptions | None = None
    temperature: _ranged(0, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    top_p: _ranged(0, 1) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    n: Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)] | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOPS)] | None = None
    seed: StrictInt | None = None
    presence_penalty: _ranged(-2, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    frequency_penalty: _ranged(-2, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    logit_bias: dict[str, _ranged(-100, 100)] | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    user: StrictStr | None = None
    top_k: StrictInt | None = None
    min_p: _ranged(0, 1) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    ignore_eos: StrictBool | None = None
    repetition_penalty: Annotated[_Number, Field(gt=0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=1024)] | None = None


_REFUSED = {
    "model": '`model` is required: "auto" or a name from /v1/models.',
    "max_tokens": "`max_tokens` must be a number from 1 to 32768.",
    "temperature": "`temperature` must be a number from 0 to 2.",
    "top_p": "`top_p` must be a number from 0 to 1.",
    "n": f"`n` must be a number from 1 to {MAX_CHOICES}.",
    "best_of": f"`best_of` must be a number from 1 to {MAX_CHOICES}.",
    "stop": f"`stop` must be a string or a list of at most {MAX_STOPS} strings.",
    "presence_penalty": "`presence_penalty` must be a number from -2 to 2.",
    "frequency_penalty": "`frequency_penalty` must be a number from -2 to 2.",
    "logit_bias": "`logit_bias` must map token ids to numbers from -100 to 100.",
    "logprobs": f"`logprobs` must be a number from 0 to {MAX_LOGPROBS}: the alternatives listed "
    "per token.",
    "stream": "`stream` must be a boolean.",
    "stream_options": "`stream_options` must be an object: {include_usage: boolean}.",
}

_PROMPT_SHAPE = (
    "`prompt` must be one prompt: a non-empty string, a list of one string, or token ids (a list "
    "of integers, or a list of one such list). A batch of prompts goes in several requests."
)


@dataclass
class CompletionsRequest:
    model: str
    prompt: str | list  # as the client sent it: passed on so
    text: str  # the prompt's text, what the rules read; "" for token ids
    token_ids: int  # how many, for a prompt of token ids
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float | None
    choices: int  # n
    passthrough: events.Passthrough


def completions_request(raw_body: bytes) -> CompletionsRequest | Reply:
    """The request as routing.completions takes it, or the 400 refusing it."""
    body = request_fields(
        raw_body,
        known=openai_fields.COMPLETION_KNOWN,
        refused=openai_fields.COMPLETION_REFUSED,
        what="completion",
    )
    if isinstance(body, Reply):
        return body
    try:
        request = _Body.model_validate(body)
    except ValidationError as exc:
        return _schema_refused(exc)
    if "prompt" not in body:
        return error_reply(400, _PROMPT_SHAPE, param="prompt")
    prompt = _prompt(body["prompt"])
    if isinstance(prompt, Reply):
        return prompt
    text, token_ids = prompt
    if request.suffix is not None and (problem := text_problem(request.suffix)) is not None:
        return error_reply(400, f"`suffix` {problem}.", code="invalid_text", param="suffix")
    options = request.stream_options
    if options is not None and options.continuous_usage_stats:
        return error_reply(
            400,
            "`stream_options.continuous_usage_stats` is not served: the usage comes once, "
            "at the end (include_usage).",
            code="unsupported_parameter",
            param="stream_options",
        )
    if options is not None and not request.stream:
        return error_reply(
            400, "`stream_options` is only allowed with `stream: true`.", param="stream_options"
        )
    fields = {
        name: value
        for name, value in body.items()
        if name not in openai_fields.COMPLETION_GATEWAY and value is not None
    }
    choices = request.n or 1
    return CompletionsRequest(
        model=request.model,
        prompt=body["prompt"],
        text=text,
        token_ids=token_ids,
        stream=bool(request.stream),
        include_usage=bool(options and options.include_usage),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        choices=choices,
        passthrough=events.Passthrough(
            fields={name: value for name, value in fields.items() if name != "temperature"},
            limited=openai_fields.kinds_for(fields, openai_fields.COMPLETIONS),
            features=_features(request),
            # What the reservation counts: every sequence the engine generates.
            choices=max(choices, request.best_of or 1),
        ),
    )


def _prompt(prompt) -> tuple[str, int] | Reply:
    """(the prompt's text, its number of token ids), or the 400."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            return error_reply(400, "`prompt` is empty.", param="prompt")
        if (problem := text_problem(prompt)) is not None:
            return error_reply(400, f"`prompt` {problem}.", code="invalid_text", param="prompt")
        return prompt, 0
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return "", len(prompt)
    return error_reply(400, _PROMPT_SHAPE, param="prompt")


def _features(request: _Body) -> tuple[str, ...]:
    found = []
    if request.logprobs is not None:
        found.append("logprobs")
    if (request.n or 1) > 1:
        found.append("n")
    extra = request.model_extra or {}
    if extra.get("response_format") or extra.get("structured_outputs"):
        found.append("structured")
    return tuple(found)


def _schema_refused(exc: ValidationError) -> Reply:
    loc = exc.errors(include_url=False)[0]["loc"]
    if not loc:
        return error_reply(400, "The request body must be a JSON object.")
    name = str(loc[0])
    message = _REFUSED.get(name)
    if message is None:
        detail = exc.errors(include_url=False)[0]["msg"]
        message = f"`{name}` is not valid: {detail}."
    return error_reply(400, message, param=name)


async def completions(headers: dict[str, str], raw_body: bytes, arrived: float) -> Reply:
    key = await authenticate(headers)
    if isinstance(key, Reply):
        return key
    parsed = completions_request(raw_body)
    if isinstance(parsed, Reply):
        return parsed
    request_key = uuid.uuid4()
    spent = events.Spent()
    asked = events.RouteRequest(
        text=parsed.text,
        user_id=key.user_id,
        groups=key.group_names,
        client=key.client,
        priority=key.priority or None,
        model=parsed.model,
        max_tokens=parsed.max_tokens,
        temperature=parsed.temperature,
        store=False,
        key=request_key,
        api_key_id=key.pk,
        spent=spent,
        passthrough=parsed.passthrough,
        api=RequestLog.Api.COMPLETIONS,
    )
    call = run_call(
        key=key,
        api=RequestLog.Api.COMPLETIONS,
        answer=complete(asked, parsed.prompt),
        arrived=arrived,
        request_key=request_key,
        spent=spent,
        features=parsed.passthrough.features,
    )
    # Up to the route (or an error) first: the route headers go out before the body.
    route = None
    try:
        async for event in call:
            if isinstance(event, events.Error):
                await call.aclose()
                if event.code == "too_long" and event.param is None:
                    event.param = "prompt"  # a target's window: the prompt is what does not fit
                return await pipeline_error_reply(event, key.user)
            if isinstance(event, events.Route):
                route = event
                break
    except RateLimited as exc:  # too many questions, or too many answers at once
        code = "rate_limit_exceeded" if exc.code == RateLimited.code else exc.code
        return error_reply(429, str(exc), code=code, headers={"Retry-After": str(exc.retry_after)})
    assert route is not None  # the pipeline's first event is a route or an error
    # The model that answers: the one named, or the fallback that answered in its place.
    model = (
        f"auto:{route.target or route.road}"
        if parsed.model == "auto"
        else route.target or parsed.model
    )
    answer = text_completion.Answer(
        completion_id=f"cmpl-{request_key.hex}", created=int(time.time()), model=model
    )
    if parsed.stream:
        reply = Reply(
            200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                OVERHEAD_HEADER: overhead_header(arrived, route.engine_ms),
            },
            stream=text_completion.completion_stream(
                call, answer, include_usage=parsed.include_usage, user=key.user
            ),
        )
    else:
        reply = await text_completion.completion_body(call, answer, user=key.user)
    reply.headers.update(route_headers(route))
    return reply
